from specdec_pipeline.cli import main

raise SystemExit(main())
