#!/usr/bin/env bash
# Brings up Oracle MySQL 9.7 LTS on a port of its own (default 3307) when
# nothing answers there, for running the suites on MySQL beside MariaDB.
# This distribution ships no MySQL and unstable's mysql-server-core needs a
# newer libc, so it runs in a `debootstrap sid` chroot, made once and reused.
# MySQL's own defaults are kept (binary log on, sync_binlog=1, caching_sha2).
#
#   scripts/mysql.sh        start (or say it already answers)
#   scripts/mysql.sh stop   stop the server started here, by its pid
#
# STEPCOLLECT_MYSQL_TEST_PORT picks the port; STEPCOLLECT_MYSQL_MAX_ALLOWED_PACKET
# the packet limit (16M; MySQL's own default is 64M, which the tests also take).
#
# Every step prints one `mysql: ...` line; a failure names its step.
set -euo pipefail

root=${STEPCOLLECT_MYSQL_CHROOT:-/var/lib/stepcollect-mysql-chroot}
host=127.0.0.1
port=${STEPCOLLECT_MYSQL_TEST_PORT:-3307}
max_connections=${STEPCOLLECT_MYSQL_MAX_CONNECTIONS:-500}
# Inside the chroot, one set per port: servers on two ports share nothing.
datadir=/var/lib/stepcollect-mysql-$port
rundir=/run/stepcollect-mysql-$port
errlog=/var/log/stepcollect-mysqld-$port.err
outlog=/var/log/stepcollect-mysqld-$port.out # what it says before errlog is open
pidfile=$rundir/mysqld.pid

say() { echo "mysql: $*" >&2; }
fail() { say "FAILED at step '$1': $2"; exit 1; }
answers() { (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; }

# step NAME CMD...: runs CMD quietly, printing one line with its time; on
# failure, the step's name and the last lines of its output.
step() {
  local name=$1 out start rc=0
  shift
  out=$(mktemp)
  start=$SECONDS
  "$@" >"$out" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    tail -n 15 "$out" | sed 's/^/mysql:   | /' >&2
    rm -f "$out"
    fail "$name" "exit status $rc"
  fi
  rm -f "$out"
  say "$name: done in $((SECONDS - start)) s"
}

# The mirror apt already uses (deb822 sources or a one-line sources.list).
mirror() {
  local m
  m=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '$2 ~ /\/debian\/?$/ {print $2; exit}')
  [ -n "$m" ] || m=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
    awk '$2 ~ /\/debian\/?$/ {print $2; exit}')
  echo "${m:-http://deb.debian.org/debian}"
}

server_pid() { # the pid mysqld wrote, if that process still runs
  local pid
  pid=$(cat "$root$pidfile" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

stop() {
  local pid i
  if ! pid=$(server_pid); then
    say "no mysqld started here is running (pid file $root$pidfile)"
    return 0
  fi
  kill -TERM "$pid"
  for ((i = 0; i < 600; i++)); do
    kill -0 "$pid" 2>/dev/null || { say "stopped mysqld (pid $pid)"; return 0; }
    sleep 0.1
  done
  fail stop "mysqld (pid $pid) still runs 60 s after SIGTERM"
}

# The step functions chain with && because errexit does not apply inside a
# function called from a condition (step's `|| rc=$?`). Each builds into a
# .partial path and renames it, so an interrupted run is redone, not reused.
make_chroot() {
  rm -rf "$root.partial" &&
    debootstrap --variant=minbase sid "$root.partial" "$(mirror)" &&
    mv "$root.partial" "$root"
}

install_mysql() {
  cp /etc/resolv.conf "$root/etc/resolv.conf" &&
    # The mirror's Release file for unstable can be past its Valid-Until date.
    chroot "$root" apt-get -o Acquire::Check-Valid-Until=false update &&
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get -o Acquire::Check-Valid-Until=false \
      install --no-install-recommends -y mysql-server-core mysql-client-core &&
    chroot "$root" apt-get clean
}

initialize() {
  rm -rf "$root$datadir.partial" &&
    chroot "$root" mysqld --initialize-insecure --user=root --datadir="$datadir.partial" \
      --log-error="$errlog.init" &&
    mv "$root$datadir.partial" "$root$datadir"
}

start_server() {
  local i pid
  mkdir -p "$root$rundir" && rm -f "$root$pidfile" || return 1
  # setsid and its own descriptors: the server outlives this script and
  # holds no pipe of its caller (CI waits on those).
  setsid chroot "$root" mysqld --user=root --datadir="$datadir" \
    --port="$port" --bind-address="$host" --mysqlx=OFF --secure-file-priv= \
    --socket="$rundir/mysqld.sock" --pid-file="$pidfile" --log-error="$errlog" \
    --max-connections="$max_connections" --max-allowed-packet="${STEPCOLLECT_MYSQL_MAX_ALLOWED_PACKET:-16M}" </dev/null >"$root$outlog" 2>&1 &
  for ((i = 0; i < 1200; i++)); do
    if answers && pid=$(server_pid); then
      return 0
    fi
    if ! kill -0 $! 2>/dev/null; then
      tail -n 15 "$root$outlog" "$root$errlog" 2>/dev/null
      echo "mysqld exited (logs $root$outlog, $root$errlog)"
      return 1
    fi
    sleep 0.1
  done
  echo "mysqld did not answer on $host:$port within 120 s (log $root$errlog)"
  return 1
}

case ${1:-start} in
stop)
  stop
  exit 0
  ;;
start) ;;
*)
  echo "usage: $0 [start|stop]" >&2
  exit 2
  ;;
esac

if answers; then
  if pid=$(server_pid); then
    say "mysqld (pid $pid) answers on $host:$port; nothing to do"
  else
    say "something answers on $host:$port (not a mysqld started here); nothing to do"
  fi
  exit 0
fi
if pid=$(server_pid); then
  fail preflight "mysqld (pid $pid) started here runs but does not answer on $host:$port; see $root$errlog, or $0 stop"
fi
[ "$(id -u)" = 0 ] || fail preflight "not root: a chroot needs root; run as root or point STEPCOLLECT_TEST_MYSQL_DSN at a running MySQL"
say "nothing answers on $host:$port; bringing up MySQL in $root"

if command -v debootstrap >/dev/null 2>&1; then
  say "debootstrap: present"
else
  step "install debootstrap" bash -c 'apt-get -o DPkg::Lock::Timeout=300 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends debootstrap'
fi

if [ -x "$root/bin/sh" ]; then
  say "chroot: reused $root"
else
  say "chroot: debootstrap --variant=minbase sid $root $(mirror) (about 2 minutes)"
  step "debootstrap" make_chroot
fi

if [ -x "$root/usr/sbin/mysqld" ]; then
  say "packages: reused mysql-server-core and mysql-client-core"
else
  step "install mysql-server-core mysql-client-core" install_mysql
fi
say "version: $(chroot "$root" mysqld --version 2>&1)"

if [ -d "$root$datadir/mysql" ]; then
  say "datadir: reused $datadir"
else
  step "mysqld --initialize-insecure" initialize
fi

step "start mysqld on $host:$port" start_server
say "mysqld answers on $host:$port (pid $(server_pid)); stop with: $0 stop"
