#!/usr/bin/env bash
# engine.sh start|stop STATE_DIR
#
# start: use the Docker Engine that answers (DOCKER_HOST or the default
# socket); if none does, start Debian's dockerd (package docker.io) as root,
# with --iptables=false (machines without netfilter rights) and its data under
# /var/lib/docker so images persist between runs, and record that we started
# it in STATE_DIR/started. stop: stop the engine only if start started it.
set -euo pipefail
cmd=${1:?usage: engine.sh start|stop STATE_DIR} state=${2:?usage: engine.sh start|stop STATE_DIR}
mkdir -p "$state"

engine_up() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

case $cmd in
start)
	if engine_up; then
		echo "engine: using the running engine $(docker version --format '{{.Server.Version}}')"
		exit 0
	fi
	if ! command -v dockerd >/dev/null; then
		echo "engine: no Docker Engine answers and dockerd is not installed: install Debian's docker.io (apt-get install docker.io) or start your engine" >&2
		exit 1
	fi
	if [ "$(id -u)" != 0 ]; then
		echo "engine: no Docker Engine answers and starting dockerd needs root: start your engine (or run as root)" >&2
		exit 1
	fi
	dockerd --iptables=false --ip-masq=false >"$state/dockerd.log" 2>&1 &
	echo $! >"$state/started"
	for _ in $(seq 1 120); do
		if engine_up; then
			echo "engine: started dockerd $(docker version --format '{{.Server.Version}}') (pid $(cat "$state/started"), log $state/dockerd.log)"
			exit 0
		fi
		if ! kill -0 "$(cat "$state/started")" 2>/dev/null; then
			rm -f "$state/started"
			echo "engine: dockerd exited at start; its log:" >&2
			tail -20 "$state/dockerd.log" >&2
			exit 1
		fi
		sleep 0.5
	done
	echo "engine: dockerd did not answer within 60 s; see $state/dockerd.log" >&2
	exit 1
	;;
stop)
	[ -f "$state/started" ] || exit 0
	pid=$(cat "$state/started")
	rm -f "$state/started"
	kill "$pid" 2>/dev/null || exit 0
	for _ in $(seq 1 60); do
		kill -0 "$pid" 2>/dev/null || { echo "engine: stopped dockerd (pid $pid)"; exit 0; }
		sleep 0.5
	done
	kill -9 "$pid" 2>/dev/null || true
	echo "engine: dockerd (pid $pid) did not stop in 30 s; killed"
	;;
*)
	echo "engine.sh: unknown command $cmd (start or stop)" >&2
	exit 2
	;;
esac
