from inferd.replica.cli import main

# The guard matters: vLLM spawns worker processes that re-import __main__.
if __name__ == "__main__":
    raise SystemExit(main())
