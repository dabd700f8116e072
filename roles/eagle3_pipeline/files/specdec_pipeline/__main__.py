from specdec_pipeline.cli import main

# vLLM starts its workers with spawn, which imports this module again in each worker: guard the entry point.
if __name__ == "__main__":
    raise SystemExit(main())
