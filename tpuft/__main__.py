from tpuft.cli import main

main()
