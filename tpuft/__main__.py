from tpuft.launcher import main

main()
