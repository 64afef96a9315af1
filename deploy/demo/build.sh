#!/usr/bin/env bash
# Build walcast for `make demo`, saying what the build is doing. On an empty
# module and build cache, go build downloads and compiles every dependency
# for minutes and prints nothing of its own; this prints each download and a
# running count of the packages compiled, and how long it took.
#
#   deploy/demo/build.sh [BIN [LDFLAGS]]    # GO names the go command
set -euo pipefail

GO=${GO:-go}
BIN=${1:-bin/walcast}
LDFLAGS=${2:-}

printf '\n\033[1m== building %s\033[0m\n' "$BIN" >&2
printf '   The first build downloads and compiles every dependency: a few minutes on a cold cache.\n   Later builds take seconds.\n' >&2

start=$(date +%s)
tty=
[ -t 2 ] && tty=1
# go build -v names each package as it compiles it; "go: downloading" lines
# name each module fetched; anything else (a compile error) is passed on.
progress() {
  local n=0 line
  while IFS= read -r line; do
    case "$line" in
    "go: downloading "*)
      [ -n "$tty" ] && [ "$n" -gt 0 ] && printf '\n' >&2
      printf '   %s\n' "${line#go: }" >&2
      ;;
    *[[:space:]]* | *:* | '#'*)
      [ -n "$tty" ] && [ "$n" -gt 0 ] && printf '\n' >&2
      printf '%s\n' "$line" >&2
      ;;
    *)
      n=$((n + 1))
      if [ -n "$tty" ]; then
        printf '\r   compiled %d packages (%.60s)\033[K' "$n" "$line" >&2
      elif [ $((n % 50)) -eq 0 ]; then
        printf '   compiled %d packages\n' "$n" >&2
      fi
      ;;
    esac
  done
  [ -n "$tty" ] && [ "$n" -gt 0 ] && printf '\n' >&2
  return 0
}

if ! "$GO" build -v -trimpath -ldflags "$LDFLAGS" -o "$BIN" ./cmd/walcast 2>&1 >/dev/null | progress; then
  printf 'demo: building %s failed (the errors are above)\n' "$BIN" >&2
  exit 1
fi
printf '   built %s in %ds\n' "$BIN" $(($(date +%s) - start)) >&2
