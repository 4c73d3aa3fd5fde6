from metrale_server.cli.main import main

# The guard keeps a spawned tensor-parallel worker, which imports this module as
# ``__mp_main__``, from running the command line again.
if __name__ == "__main__":
    main()
