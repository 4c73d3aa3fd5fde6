from metrale_server.cli.main import main

main()
