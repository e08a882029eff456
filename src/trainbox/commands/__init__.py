"""One module per `trainbox` command, named after it and declaring its COMMAND once;
registry.py lists them. Most are built on process/launching.py's shared path.

Below the CLI (which parses and turns errors into exit codes), above runtime/, train/ and infer/.
Nothing here imports torch at module level: a command pins CPUs before torch loads.
"""
