"""The engine: sequences, block manager, scheduler, model runner, engine core, ``AsyncEngine``,
``LLM``."""
