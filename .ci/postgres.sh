#!/bin/sh
# PostgreSQL for the store tests: Debian's server (installed where it is missing, with apt-get as root or
# with password-less sudo), started as a throwaway cluster in $FORGE_PG_DIR (default /tmp/forge-pg) on a
# Unix socket there, port $FORGE_PG_PORT (default 54329), no TCP, trust authentication, role `forge`,
# database `forge_test`. Nothing to do where it already runs. Where it cannot be had, it says so and carries
# on: the PostgreSQL store tests then skip, saying why.
set -u
DIR=${FORGE_PG_DIR:-/tmp/forge-pg}
PORT=${FORGE_PG_PORT:-54329}
bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
BIN=$(bin)
SUDO=""
if [ "$(id -u)" -ne 0 ] && sudo -n true 2>/dev/null; then SUDO="sudo -n"; fi
if [ -z "$BIN" ]; then
    if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
        $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            postgresql >/dev/null
        BIN=$(bin)
    fi
fi
if [ -z "$BIN" ]; then
    echo "postgres.sh: no PostgreSQL server here and none could be installed; the PostgreSQL store tests skip" >&2
    exit 0
fi
"$BIN/pg_isready" -q -h "$DIR" -p "$PORT" 2>/dev/null && exit 0
AS=""  # the server refuses to run as root: the package's postgres user runs it then
if [ "$(id -u)" -eq 0 ]; then AS="runuser -u postgres --"; fi
rm -rf "$DIR" && mkdir -p "$DIR" && { [ -z "$AS" ] || chown postgres "$DIR"; }
$AS "$BIN/initdb" -D "$DIR/data" -A trust -U forge >/dev/null &&
    $AS "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w -o "-k $DIR -p $PORT -c listen_addresses=''" start >/dev/null &&
    $AS "$BIN/createdb" -h "$DIR" -p "$PORT" -U forge forge_test ||
    echo "postgres.sh: the server did not start (see $DIR/log); the PostgreSQL store tests skip" >&2
exit 0
