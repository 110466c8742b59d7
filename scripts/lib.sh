# Shared by scripts/demo.sh, test/run_all.sh and test/bench/run.sh (source it from the
# repository root): the Debian packages, the build, and throwaway PostgreSQL clusters.
# Sourcing it defines functions and variables and changes nothing else.
#
# PostgreSQL refuses to run as root, so every cluster here is created and run by the
# postgres OS user, in a directory of its own, listening on 127.0.0.1 only.
# Every function returns non-zero on failure, also when called inside `if` or `||`
# (where `set -e` does not apply).

# PG15_PREFIX: another copy of Debian's PostgreSQL 15 (see pg_private_copy).
PG_BIN=${PG15_PREFIX:-/usr/lib/postgresql/15}/bin
PG_CONFIG=$PG_BIN/pg_config
export PATH="$PG_BIN:$PATH"
# English messages, UTF-8 clusters and byte-order sorting, whatever the machine's locale
# (pg_regress compares output byte by byte).
export LANG=C.UTF-8 LC_ALL=C.UTF-8

# Everything the demo, the build and every kind of test need on Debian 12. clang and
# libclang-rt-14-dev are for the libFuzzer targets; python3-psycopg(-pool) for the
# HTTP example (examples/http) and its test; pgbouncer for the pooler test; sqlsmith
# for the random-query test (test/t/011_sqlsmith.pl); nodejs for the fingerprint client
# (examples/fingerprint); rabbitmq-server and python3-pika for the messaging example
# (examples/messaging) and its test, which runs a broker of its own (the package's
# system broker, if its installation started one, is left alone);
# prometheus-postgres-exporter for the exporter query of docs/operations.md
# (test/t/020_exporter.pl, which runs one of its own) and prometheus for its promtool,
# which checks and tests the alert rules there; debhelper, dpkg-dev,
# build-essential and postgresql-server-dev-all (pg_buildext) for the Debian package
# (debian/);
# the JDK with JDBC, Go with lib/pq, and npm (node-postgres) for the clients of
# examples/clients and test/t/021_clients.pl; FastAPI, Starlette and uvicorn for the
# Python middleware (middleware/python, test/t/029_middleware.pl; its Express app comes
# from npm); Debian's Go packages for the relay (relay/: AMQP, NATS, Prometheus) and
# nats-server for its test (test/t/033_relay.pl).
REQUIRED_PACKAGES=(postgresql-15 postgresql-client-15 postgresql-server-dev-15 libssl-dev
                   g++ make cmake libgtest-dev libipc-run-perl perl clang libclang-rt-14-dev
                   python3 python3-psycopg python3-psycopg-pool pgbouncer sqlsmith git
                   clang-format clang-tidy bear nodejs rabbitmq-server python3-pika
                   prometheus-postgres-exporter prometheus debhelper dpkg-dev build-essential
                   postgresql-server-dev-all
                   openjdk-17-jdk-headless libpostgresql-jdbc-java golang-go
                   golang-github-lib-pq-dev python3-fastapi python3-starlette python3-uvicorn
                   libjakarta-servlet-api-java libjackson2-databind-java libtomcat10-embed-java
                   libjakarta-annotation-api-java
                   golang-github-rabbitmq-amqp091-go-dev golang-github-nats-io-go-nats-dev
                   golang-github-prometheus-client-golang-dev nats-server)
# Debian's nodejs comes without npm; NodeSource's bundles it and conflicts with
# Debian's npm package. So Debian's npm only where there is no npm.
command -v npm >/dev/null 2>&1 || REQUIRED_PACKAGES+=(npm)

# What the demo needs: the server, its headers, a compiler and OpenSSL; nothing else.
DEMO_PACKAGES=(postgresql-15 postgresql-client-15 postgresql-server-dev-15 libssl-dev g++ make)

# A section banner.
say() { printf '\n== %s\n' "$*"; }

# ensure_packages [PACKAGE...]: installs the packages (default REQUIRED_PACKAGES) that
# are missing; in CI (CI=true) installs all of them, which also brings them up to date.
# apt-get update runs only when something is installed.
ensure_packages() {
  # Once per run: .ci/run installs, then test/run_all.sh finds everything there.
  [ "${IDEM_PACKAGES_ENSURED:-}" = 1 ] && return 0
  local package wanted=() packages=("$@")
  [ "$#" -gt 0 ] || packages=("${REQUIRED_PACKAGES[@]}")
  for package in "${packages[@]}"; do
    if [ "${CI:-}" = true ] ||
       ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
      wanted+=("$package")
    fi
  done
  if [ "${#wanted[@]}" -eq 0 ]; then
    [ "$#" -gt 0 ] || export IDEM_PACKAGES_ENSURED=1
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing packages (run as root to install them): ${wanted[*]}" >&2
    return 1
  fi
  say "installing ${wanted[*]}"
  # Installing starts no system service (PostgreSQL's cluster "main", RabbitMQ,
  # PgBouncer): the tests start their own. Container images usually say so in
  # policy-rc.d already; elsewhere one is put there for the install only.
  local policy=/usr/sbin/policy-rc.d added_policy=no status=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added_policy=yes
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      -o Dpkg::Use-Pty=0 "${wanted[@]}" || status=$?
  [ "$added_policy" = no ] || rm -f "$policy"
  # Only the whole list counts as ensured for a later call in the same run.
  [ "$status" -eq 0 ] && [ "$#" -eq 0 ] && export IDEM_PACKAGES_ENSURED=1
  return "$status"
}

# Builds the extension in the current directory (the repository root) and installs it.
build_and_install() {
  make -s -j2 PG_CONFIG="$PG_CONFIG" && make -s install PG_CONFIG="$PG_CONFIG"
}

# True when the extension's library is installed, so it may be preloaded.
library_installed() {
  [ -f "$("$PG_CONFIG" --pkglibdir)/idempotency.so" ]
}

# Prints a TCP port that nothing on 127.0.0.1 listens on, from 54320-54999, starting
# at a random place so that runs side by side rarely pick the same one.
free_port() {
  local i port offset=$((RANDOM % 680))
  for ((i = 0; i < 680; i++)); do
    port=$((54320 + (offset + i) % 680))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  echo "no free TCP port in 54320-54999" >&2
  return 1
}

# init_cluster DIR [SETTING...]: a fresh data directory DIR/data owned by postgres,
# trusting local connections, with the given postgresql.conf lines
# (e.g. "shared_preload_libraries = 'idempotency'"). Its socket and log go in DIR.
init_cluster() {
  local dir=$1 setting
  shift
  mkdir -p "$dir" && chown postgres: "$dir" && chmod 755 "$dir" || return 1
  runuser -u postgres -- "$PG_BIN/initdb" -D "$dir/data" -A trust -U postgres \
    -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
  {
    echo "listen_addresses = '127.0.0.1'"
    echo "unix_socket_directories = '$dir'"
    for setting in "$@"; do echo "$setting"; done
  } >>"$dir/data/postgresql.conf"
}

# launch_cluster DIR PORT: starts the cluster of init_cluster on PORT and waits until
# it accepts connections. On failure the log is in DIR/server.log.
launch_cluster() {
  local dir=$1 port=$2
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 120 \
    -o "-c port=$port" start >/dev/null 2>&1
}

# start_cluster DIR PORT [SETTING...]: init_cluster and launch_cluster in one.
start_cluster() {
  local dir=$1 port=$2
  shift 2
  init_cluster "$dir" "$@" || return 1
  launch_cluster "$dir" "$port" || { tail -n 20 "$dir/server.log" >&2; return 1; }
}

# start_cluster_on_free_port DIR [SETTING...]: like start_cluster on a port of
# free_port, trying another one when a concurrent process took it first. Sets
# CLUSTER_PORT.
start_cluster_on_free_port() {
  local dir=$1 port
  shift
  init_cluster "$dir" "$@" || return 1
  for _ in 1 2 3 4 5; do
    port=$(free_port) || return 1
    if launch_cluster "$dir" "$port"; then
      # shellcheck disable=SC2034  # for the caller
      CLUSTER_PORT=$port
      return 0
    fi
    grep -q 'could not bind\|could not create any TCP/IP sockets' "$dir/server.log" 2>/dev/null || break
  done
  echo "the cluster in $dir did not start:" >&2
  tail -n 20 "$dir/server.log" >&2
  return 1
}

# stop_cluster DIR: stops the cluster of start_cluster if it runs (fast, else
# immediate); quiet, and never fails.
stop_cluster() {
  stop_data_directory "$1/data"
}

# stop_data_directory DATADIR: stops the postmaster of one data directory, if any.
stop_data_directory() {
  local data=$1
  [ -f "$data/postmaster.pid" ] || return 0
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$data" -m fast -w -t 30 stop >/dev/null 2>&1 ||
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$data" -m immediate -w -t 30 stop >/dev/null 2>&1 ||
    true
}

# stop_clusters_under DIR: stops every cluster whose data directory lies in DIR (the
# ones this script started, and the TAP tests' if they were interrupted).
stop_clusters_under() {
  local pidfile
  [ -d "$1" ] || return 0
  while IFS= read -r pidfile; do
    stop_data_directory "$(dirname "$pidfile")"
  done < <(find "$1" -name postmaster.pid -type f 2>/dev/null)
  return 0
}
