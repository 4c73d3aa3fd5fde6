"""gpt-oss on the CPU against HF transformers: ``benches/moe_cpu.py --family gpt_oss``.

    python benches/gpt_oss_cpu.py [--layers 8] [--hidden 768] [--experts 32] [--top-k 4]
        [--prompt-len 256] [--decode-tokens 64] [--kernel-backend auto] [--model-dir DIR]
        [--cpu-time]

Takes every option of ``moe_cpu.py``; see its docstring for what is timed.
"""

from __future__ import annotations

from moe_cpu import main

if __name__ == "__main__":
    main(default_family="gpt_oss")
