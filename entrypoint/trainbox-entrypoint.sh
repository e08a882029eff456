#!/bin/sh
# The image's ENTRYPOINT (run under tini). Used by `docker run IMAGE [ARGS]` and `apptainer run
# train.sif [ARGS]`; `apptainer exec`, Kubernetes `command:` and Pyxis skip it, so nothing here
# may be needed for correctness: every runtime setting lives in the image's ENV.
#
#   no arguments, options or key=value overrides  ->  trainbox run [...]
#   a trainbox subcommand (run exec doctor config report hang eval predict export) -> trainbox <subcommand> ...
#   anything else (bash, python)                   ->  exec'd as it is
set -eu

# TRAINBOX_DEFAULT_COMMAND lets an image built for checks default to `doctor` instead.
default_command=${TRAINBOX_DEFAULT_COMMAND:-run}

case "${1-}" in
  # Options and `key.sub=value` overrides both belong to the default command.
  "" | -* | *=*) exec trainbox "$default_command" "$@" ;;
  run | exec | doctor | config | report | hang | eval | predict | export) exec trainbox "$@" ;;
  *) exec "$@" ;;
esac
