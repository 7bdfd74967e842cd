from servingtopology.cli.main import main; raise SystemExit(main())
