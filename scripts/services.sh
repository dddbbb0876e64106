#!/usr/bin/env bash
# Makes sure MySQL/MariaDB and Redis answer at the configured addresses,
# starting local ones where they do not (installing them from the
# distribution's packages first when running as root without them).
# Used by `make run`, `make test` (through .ci/run) and `make bench`.
# With --mysql it also brings up MySQL 9.7 on its own port (scripts/mysql.sh),
# for `make test-mysql`; MariaDB stays the default server.
set -euo pipefail

with_mysql=false
case ${1:-} in
--mysql) with_mysql=true ;;
"") ;;
*)
  echo "usage: $0 [--mysql]" >&2
  exit 2
  ;;
esac

mysql_host=${STEPCOLLECT_MYSQL_HOST:-127.0.0.1}
mysql_port=${STEPCOLLECT_MYSQL_PORT:-3306}
redis_host=${STEPCOLLECT_REDIS_HOST:-127.0.0.1}
redis_port=${STEPCOLLECT_REDIS_PORT:-6379}

say() { echo "services: $*" >&2; }

answers() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_for() { # name host port seconds
  local i
  for ((i = 0; i < $4 * 10; i++)); do
    answers "$2" "$3" && return 0
    sleep 0.1
  done
  say "$1 did not answer on $2:$3 within $4 s"
  return 1
}

install_if_missing() { # binary package
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" != 0 ]; then
    say "$1 is not installed and this is not root: install $2, or point STEPCOLLECT_MYSQL_DSN / STEPCOLLECT_REDIS_URL at running servers"
    return 1
  fi
  say "installing $2"
  apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq "$2" >/dev/null
}

if answers "$mysql_host" "$mysql_port"; then
  say "MySQL/MariaDB answers on $mysql_host:$mysql_port"
else
  say "MySQL/MariaDB does not answer on $mysql_host:$mysql_port; starting a local MariaDB"
  install_if_missing mariadbd mariadb-server || install_if_missing mysqld mariadb-server
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
  if [ ! -d /var/lib/mysql/mysql ]; then
    mariadb-install-db --user=mysql >/dev/null
  fi
  start-stop-daemon --start --oknodo --background --exec "$(command -v mariadbd || command -v mysqld)"
  wait_for MariaDB "$mysql_host" "$mysql_port" 60
  say "MariaDB started"
fi

if answers "$redis_host" "$redis_port"; then
  say "Redis answers on $redis_host:$redis_port"
else
  say "Redis does not answer on $redis_host:$redis_port; starting a local one"
  install_if_missing redis-server redis-server
  redis-server --daemonize yes --bind "$redis_host" --port "$redis_port" --save "" --appendonly no >/dev/null
  wait_for Redis "$redis_host" "$redis_port" 30
  say "Redis started"
fi

if $with_mysql; then
  bash "$(dirname "$0")/mysql.sh"
fi
