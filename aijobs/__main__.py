from aijobs.cli import main

main()
