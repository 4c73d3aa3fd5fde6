from metrale_server.cli import main

main()
