from orchestrator.cli.commands import main

raise SystemExit(main())
