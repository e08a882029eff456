#!/bin/sh
# The image's ENTRYPOINT (run under tini). Used by `docker run IMAGE [ARGS]` and `apptainer run
# train.sif [ARGS]`; `apptainer exec`, Kubernetes `command:` and Pyxis skip it, so nothing here
# may be needed for correctness: every runtime setting lives in the image's ENV.
#
#   no arguments, or only options  ->  trainbox <default command> [options]
#   a trainbox subcommand          ->  trainbox <subcommand> ...
#   anything else (bash, python)   ->  exec'd as it is
set -eu

# The default becomes `run` once the trainer ships; `doctor` is what exists today.
default_command=${TRAINBOX_DEFAULT_COMMAND:-doctor}

case "${1-}" in
  "" | -*) exec trainbox "$default_command" "$@" ;;
  doctor | exec) exec trainbox "$@" ;;
  *) exec "$@" ;;
esac
