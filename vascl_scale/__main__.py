from vascl_scale.cli import main

main()
