from mconv.cli.app import main

main()
