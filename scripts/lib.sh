# Shared by scripts/demo.sh and test/run_all.sh: packages, build, throwaway clusters.
# Source it; it defines functions and PG_BIN, and changes nothing by itself.

PG_BIN=/usr/lib/postgresql/15/bin
export PATH="$PG_BIN:$PATH"

REQUIRED_PACKAGES=(postgresql-15 postgresql-client-15 postgresql-server-dev-15 libssl-dev
                   g++ make cmake libgtest-dev libipc-run-perl perl clang libclang-rt-14-dev)

say() { printf '\n== %s\n' "$*"; }

# Installs the Debian packages that are missing (all of them are checked in CI).
ensure_packages() {
  local missing=()
  for package in "${REQUIRED_PACKAGES[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
      echo "run as root to install: ${missing[*]}" >&2
      return 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# Builds and installs the extension from the repository root.
build_and_install() {
  make -s -j2 PG_CONFIG="$PG_BIN/pg_config"
  make -s install PG_CONFIG="$PG_BIN/pg_config"
}

# A port nobody listens on.
free_port() {
  local port
  for port in $(seq 54320 54399); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  return 1
}

# start_cluster DIR PORT [SETTING...]: a fresh cluster in DIR, owned by the postgres
# OS user (PostgreSQL will not run as root), listening on 127.0.0.1 only.
start_cluster() {
  local dir=$1 port=$2
  shift 2
  mkdir -p "$dir"
  chown postgres "$dir"
  runuser -u postgres -- "$PG_BIN/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
  {
    echo "listen_addresses = '127.0.0.1'"
    echo "port = $port"
    echo "unix_socket_directories = '$dir'"
    for setting in "$@"; do echo "$setting"; done
  } >>"$dir/data/postgresql.conf"
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
}

stop_cluster() {
  local dir=$1
  [ -f "$dir/data/postmaster.pid" ] &&
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1
  return 0
}
