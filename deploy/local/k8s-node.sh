#!/usr/bin/env bash
# k8s-node.sh start|stop|import STATE_DIR [IMAGE...]
#
# A real one-node Kubernetes cluster on this machine, as root, for make
# k8s-test (docs/deployment.md, "Kubernetes"): etcd, kube-apiserver (Pod
# Security admission on), kube-controller-manager, kube-scheduler, the
# kubelet, kube-proxy (iptables) and CoreDNS, from the binaries make
# k8s-node-bin built (K8S_BIN, COREDNS); containerd, runc, the CNI plugins
# and iptables from Debian. Everything the cluster keeps lives under
# STATE_DIR: its own certificates, its own containerd (own socket and
# root, never the Docker Engine's), pod volumes, logs (STATE_DIR/logs).
#
#   start    brings the node up and waits until it is Ready; prints the
#            KUBECONFIG line. Idempotent: a component already running is
#            left alone.
#   import   loads images into the node's containerd (no registry here):
#            `docker save` of each IMAGE, piped to `ctr images import`.
#   stop     deletes every pod through the kubelet, stops every component,
#            and leaves the host as it was: no mounts, containers, bridge,
#            iptables chains or cgroups of the cluster, sysctls restored.
#
# What the machine needs, and why each setting, is in docs/deployment.md.
set -euo pipefail
cmd=${1:?usage: k8s-node.sh start|stop|import STATE_DIR [IMAGE...]}
state=${2:?usage: k8s-node.sh start|stop|import STATE_DIR [IMAGE...]}
shift 2
mkdir -p "$state"
S=$(cd "$state" && pwd)
P=$S/pki C=$S/config L=$S/logs
K8S_BIN=${K8S_BIN:-}
COREDNS=${COREDNS:-}
SOCK=$S/containerd.sock
# Addresses: the pod network, the service network, and the node's ports
# (none of the usual ones, so a cluster already on the machine is left
# alone).
POD_CIDR=10.244.0.0/24 POD_GW=10.244.0.1 SERVICE_CIDR=10.96.0.0/16 SERVICE_IP=10.96.0.1
APISERVER_PORT=16443 ETCD_PORT=23790
PAUSE_IMAGE=recmesh.local/pause:1
NODE=$(hostname | tr 'A-Z_' 'a-z-')
HOSTIP=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
HOSTIP=${HOSTIP:-127.0.0.1}
ctr_() { ctr --address "$SOCK" -n k8s.io "$@"; }
kubectl_() { "$K8S_BIN/kubectl" --kubeconfig "$P/admin.kubeconfig" --cache-dir "$S/kubectl-cache" "$@"; }
# alive NAME: the component's recorded process runs, and is still that
# component: a pid file left by a node the machine lost (a reboot) may
# name a dead pid, or one reused by anything else.
alive() {
	[ -f "$S/pids/$1" ] || return 1
	[ "$(cat "/proc/$(cat "$S/pids/$1")/comm" 2>/dev/null)" = "$(printf %.15s "$1")" ]
}
say() { echo "k8s-node: $*"; }
die() { echo "k8s-node: $*" >&2; exit 1; }

# launch NAME CMD...: runs a component in the background, its log in L.
launch() {
	local n=$1
	shift
	if alive "$n"; then
		return 0
	fi
	"$@" >>"$L/$n.log" 2>&1 &
	echo $! >"$S/pids/$n"
}

# wait_for WHAT SECONDS CMD...: until CMD succeeds; a component that died
# meanwhile ends the wait with its log.
wait_for() {
	local what=$1 n=$2
	shift 2
	for _ in $(seq "$n"); do
		"$@" >/dev/null 2>&1 && return 0
		for p in "$S"/pids/*; do
			[ -e "$p" ] || continue
			if ! alive "$(basename "$p")"; then
				tail -n 30 "$L/$(basename "$p").log" >&2
				die "$(basename "$p") exited while waiting for $what (log $L/$(basename "$p").log)"
			fi
		done
		sleep 1
	done
	die "timed out after ${n}s waiting for $what (logs in $L)"
}

# cert NAME SUBJECT [SANS [USAGE]]: a key and a certificate signed by the
# node's CA.
cert() {
	local name=$1 subj=$2 sans=${3:-} usage=${4:-clientAuth}
	[ -f "$P/$name.crt" ] && return 0
	openssl genrsa -out "$P/$name.key" 2048 2>/dev/null
	openssl req -new -key "$P/$name.key" -subj "$subj" -out "$P/$name.csr"
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$usage"
		[ -z "$sans" ] || echo "subjectAltName=$sans"
	} >"$P/$name.ext"
	openssl x509 -req -in "$P/$name.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 365 \
		-extfile "$P/$name.ext" -out "$P/$name.crt" 2>/dev/null
	rm -f "$P/$name.csr" "$P/$name.ext"
}

# kubeconfig USER: USER's client certificate, for the API server.
kubeconfig() {
	cat >"$P/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: recmesh-node
  cluster:
    certificate-authority: $P/ca.crt
    server: https://127.0.0.1:$APISERVER_PORT
users:
- name: $1
  user:
    client-certificate: $P/$1.crt
    client-key: $P/$1.key
contexts:
- name: recmesh-node
  context: {cluster: recmesh-node, user: $1}
current-context: recmesh-node
EOF
}

pki() {
	mkdir -p "$P"
	if [ ! -f "$P/ca.crt" ]; then
		openssl genrsa -out "$P/ca.key" 2048 2>/dev/null
		openssl req -x509 -new -nodes -key "$P/ca.key" -subj "/CN=recmesh-node-ca" -days 365 -out "$P/ca.crt"
	fi
	if [ ! -f "$P/sa.key" ]; then
		openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
		openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
	fi
	cert apiserver "/CN=kube-apiserver" "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$NODE,IP:127.0.0.1,IP:$SERVICE_IP,IP:$HOSTIP" serverAuth
	cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
	cert admin "/O=system:masters/CN=kubernetes-admin"
	cert controller-manager "/CN=system:kube-controller-manager"
	cert scheduler "/CN=system:kube-scheduler"
	cert kube-proxy "/CN=system:kube-proxy"
	cert kubelet "/O=system:nodes/CN=system:node:$NODE"
	cert kubelet-serving "/CN=$NODE" "DNS:$NODE,DNS:localhost,IP:127.0.0.1,IP:$HOSTIP" serverAuth
	cert coredns "/CN=system:coredns"
	for u in admin controller-manager scheduler kube-proxy kubelet coredns; do
		kubeconfig "$u"
	done
}

configs() {
	mkdir -p "$C/cni"
	# Debian's containerd 1.6 (config version 2). restrict_oom_score_adj:
	# a VM without CAP_SYS_RESOURCE cannot give the sandbox -998.
	cat >"$C/containerd.toml" <<EOF
version = 2
root = "$S/containerd"
state = "$S/containerd-run"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = "$S/containerd-debug.sock"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$S/containerd-opt"
[plugins."io.containerd.grpc.v1.cri"]
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  sandbox_image = "$PAUSE_IMAGE"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$S/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$C/cni"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ""
EOF
	cat >"$C/cni/10-recmesh.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "recmesh-node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$S/cni-ipam",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GW"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
	cat >"$C/admission.yaml" <<EOF
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults: {enforce: baseline, enforce-version: latest, audit: restricted, audit-version: latest, warn: restricted, warn-version: latest}
    exemptions: {usernames: [], runtimeClasses: [], namespaces: [kube-system]}
EOF
	# cgroupfs (no systemd here); failCgroupV1: false because this host is
	# cgroup v1 (the kubelet refuses it otherwise since 1.35). Images come
	# only from import: never collect them.
	cat >"$C/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
containerRuntimeEndpoint: unix://$SOCK
clusterDNS: ["$POD_GW"]
clusterDomain: cluster.local
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $P/ca.crt}
authorization:
  mode: Webhook
tlsCertFile: $P/kubelet-serving.crt
tlsPrivateKeyFile: $P/kubelet-serving.key
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
podLogsDir: $S/pod-logs
volumePluginDir: $S/kubelet-plugins
failSwapOn: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%}
EOF
	# masqueradeAll: a pod reaching a Service whose endpoint is on the same
	# bridge gets its answer back through the node.
	cat >"$C/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $P/kube-proxy.kubeconfig}
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
iptables: {masqueradeAll: true, localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
metricsBindAddress: 127.0.0.1:10349
healthzBindAddress: 127.0.0.1:10356
nodePortAddresses: [primary]
EOF
	# CoreDNS on the node, on the bridge's address (the pods' DNS server).
	cat >"$C/Corefile" <<EOF
.:53 {
    bind $POD_GW
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $P/coredns.kubeconfig recmesh-node
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 30
}
EOF
	cat >"$C/coredns-rbac.yaml" <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:coredns"}
EOF
}

pause_image() {
	ctr_ images ls -q | grep -qx "docker.io/$PAUSE_IMAGE\|$PAUSE_IMAGE" && return 0
	local here
	here=$(cd "$(dirname "$0")" && pwd)
	(cd "$here/.." && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$S/images/pause" ./local/pause)
	python3 "$here/image-tar.py" "$S/images/pause.tar" "$PAUSE_IMAGE" "$S/images/pause" >/dev/null
	ctr_ images import "$S/images/pause.tar" >/dev/null
}

start() {
	[ "$(id -u)" = 0 ] || die "a node needs root (the kubelet, containerd, the bridge)"
	for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
		[ -x "$K8S_BIN/$b" ] || die "no $b in K8S_BIN=$K8S_BIN: run make k8s-node-bin"
	done
	[ -x "$COREDNS" ] || die "no CoreDNS at COREDNS=$COREDNS: run make k8s-node-bin"
	for b in containerd ctr runc iptables openssl /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/portmap; do
		command -v "$b" >/dev/null || die "$b missing: apt-get install containerd runc containernetworking-plugins iptables openssl"
	done
	[ -z "$(swapon --show --noheadings 2>/dev/null)" ] || say "swap is on: the kubelet runs with failSwapOn false"
	mkdir -p "$S/pids" "$L" "$S/images" "$S/kubelet"
	for p in "$S"/pids/*; do
		if [ -e "$p" ] && ! alive "$(basename "$p")"; then rm -f "$p"; fi
	done
	# Host paths the kubelet, containerd's shims and libcni use whatever
	# their configuration, and the frontend-deployment overlay's hostPath
	# segment directory: remember which did not exist, for stop.
	if [ ! -f "$S/host-created" ]; then
		for p in /var/lib/kubelet /var/log/containers /var/log/pods /run/containerd /var/lib/cni /usr/libexec/kubernetes /dev/shm/recmesh; do
			[ -e "$p" ] || echo "$p"
		done >"$S/host-created"
	fi
	if [ ! -f "$S/sysctl.orig" ]; then
		modprobe br_netfilter 2>/dev/null || true
		# The kubelet sets the panic and overcommit ones itself.
		sysctl -e net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables \
			kernel.panic kernel.panic_on_oops vm.overcommit_memory >"$S/sysctl.orig"
	fi
	sysctl -qw net.ipv4.ip_forward=1
	sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
	pki
	configs

	launch containerd containerd --config "$C/containerd.toml"
	wait_for containerd 60 ctr --address "$SOCK" version
	pause_image
	# The bridge before the first pod, so CoreDNS can bind its address.
	ip link show cni0 >/dev/null 2>&1 || { ip link add cni0 type bridge && ip addr add "$POD_GW/24" dev cni0; }
	ip link set cni0 up
	# Cluster IPs stay on the node: one kube-proxy has no rule for at that
	# instant (a Service between endpoints) fails here, instead of leaving
	# by the default route for whatever answers there (this machine's
	# egress proxy answers any address with HTTP 404). kube-proxy's DNAT
	# still reroutes the rest to their pods.
	ip route replace "$SERVICE_CIDR" dev cni0

	launch etcd "$K8S_BIN/etcd" --name node --data-dir "$S/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
		--initial-cluster node=http://127.0.0.1:23800 --listen-metrics-urls http://127.0.0.1:23810
	wait_for etcd 60 curl -sf http://127.0.0.1:23810/health
	launch kube-apiserver "$K8S_BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
		--bind-address=0.0.0.0 --secure-port=$APISERVER_PORT --advertise-address="$HOSTIP" \
		--service-cluster-ip-range=$SERVICE_CIDR \
		--client-ca-file="$P/ca.crt" --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
		--kubelet-client-certificate="$P/apiserver-kubelet-client.crt" --kubelet-client-key="$P/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=InternalIP,Hostname \
		--service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction,PodSecurity \
		--admission-control-config-file="$C/admission.yaml" --allow-privileged=true --profiling=false
	wait_for kube-apiserver 180 curl -sf --cacert "$P/ca.crt" "https://127.0.0.1:$APISERVER_PORT/readyz"
	kubectl_ apply -f "$C/coredns-rbac.yaml" >/dev/null
	launch kube-controller-manager "$K8S_BIN/kube-controller-manager" --kubeconfig="$P/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$P/controller-manager.kubeconfig" --authorization-kubeconfig="$P/controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port=10357 --leader-elect=false \
		--cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
		--service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" --use-service-account-credentials=true \
		--allocate-node-cidrs=true --cluster-cidr=$POD_CIDR --node-cidr-mask-size=24 --service-cluster-ip-range=$SERVICE_CIDR \
		--flex-volume-plugin-dir="$S/kubelet-plugins"
	launch kube-scheduler "$K8S_BIN/kube-scheduler" --kubeconfig="$P/scheduler.kubeconfig" \
		--authentication-kubeconfig="$P/scheduler.kubeconfig" --authorization-kubeconfig="$P/scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port=10359 --leader-elect=false
	launch kubelet "$K8S_BIN/kubelet" --config="$C/kubelet.yaml" --kubeconfig="$P/kubelet.kubeconfig" \
		--root-dir="$S/kubelet" --hostname-override="$NODE" --node-ip="$HOSTIP"
	launch kube-proxy "$K8S_BIN/kube-proxy" --config="$C/kube-proxy.yaml"
	launch coredns "$COREDNS" -conf "$C/Corefile"
	wait_for "node $NODE Ready" 300 sh -c "'$K8S_BIN/kubectl' --kubeconfig '$P/admin.kubeconfig' get node '$NODE' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
	# Every namespace's default ServiceAccount must exist before a pod.
	wait_for "the default ServiceAccount" 120 kubectl_ -n default get serviceaccount default
	say "node $NODE ready: server $("$K8S_BIN/kubectl" --kubeconfig "$P/admin.kubeconfig" version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1), containerd $(containerd --version | awk '{print $3}')"
	echo "KUBECONFIG=$P/admin.kubeconfig"
}

import() {
	alive containerd || die "the node's containerd is not running: k8s-node.sh start first"
	[ $# -gt 0 ] || die "import: name the images"
	docker save "$@" | ctr_ images import - >/dev/null
	say "imported $*"
}

stop_one() {
	alive "$1" || { rm -f "$S/pids/$1"; return 0; }
	local pid
	pid=$(cat "$S/pids/$1")
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 30); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.5
	done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$S/pids/$1"
}

stop() {
	[ -d "$S/pids" ] || { say "nothing to stop in $S"; return 0; }
	# Pods go through the kubelet first, so the CNI plugin releases their
	# addresses and interfaces.
	if alive kube-apiserver && alive kubelet; then
		for ns in $(kubectl_ get namespaces -o name 2>/dev/null | cut -d/ -f2); do
			kubectl_ -n "$ns" delete deployments,replicasets,daemonsets,statefulsets,jobs --all --wait=false >/dev/null 2>&1 || true
			kubectl_ -n "$ns" delete pods --all --grace-period=1 --wait=false >/dev/null 2>&1 || true
		done
		# The kubelet keeps exited containers until it collects them: wait
		# for no running task and no pod address held instead.
		for _ in $(seq 90); do
			if ! ctr_ tasks ls 2>/dev/null | grep -q RUNNING && [ -z "$(ls "$S/cni-ipam/recmesh-node" 2>/dev/null | grep -v -e lock -e last_reserved)" ]; then
				break
			fi
			sleep 1
		done
	fi
	for c in coredns kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do
		stop_one "$c"
	done
	if alive containerd; then
		for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
		sleep 1
		for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks rm -f "$t" >/dev/null 2>&1 || true; done
		for c in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers rm "$c" >/dev/null 2>&1 || true; done
	fi
	stop_one containerd
	for pid in $(pgrep -f "containerd-shim.*-address $SOCK" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
	# Mounts under the state directory, deepest first.
	for _ in 1 2 3; do
		mps=$(awk -v s="$S/" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo | sort -r)
		[ -n "$mps" ] || break
		for m in $mps; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
	done
	ip link del cni0 2>/dev/null || true
	# kube-proxy's chains and the bridge plugin's masquerade rules.
	for tbl in filter nat mangle; do
		# Jumps into those chains, and rules naming the pod network.
		rules=$(iptables -t $tbl -S 2>/dev/null | grep -E -e '^-A (INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) .*-j (KUBE-|CNI-)' \
			-e "^-A (POSTROUTING|PREROUTING|OUTPUT) .*(${POD_CIDR%.*}\.|cni0)" || true)
		while read -r r; do
			[ -z "$r" ] || eval iptables -t $tbl "${r/#-A/-D}" || true
		done <<<"$rules"
		chains=$(iptables -t $tbl -S 2>/dev/null | awk '/^-N (KUBE-|CNI-)/ {print $2}')
		for ch in $chains; do iptables -t $tbl -F "$ch" 2>/dev/null || true; done
		for ch in $chains; do iptables -t $tbl -X "$ch" 2>/dev/null || true; done
	done
	for ctl in /sys/fs/cgroup/*/; do
		for top in kubepods kubepods.slice k8s.io; do
			[ -d "$ctl$top" ] && find "$ctl$top" -depth -type d -exec rmdir {} \; 2>/dev/null || true
		done
	done
	if [ -f "$S/host-created" ]; then
		while read -r p; do [ -n "$p" ] && rm -rf "$p"; done <"$S/host-created"
		rm -f "$S/host-created"
	fi
	if [ -f "$S/sysctl.orig" ]; then
		sed 's/ = /=/' "$S/sysctl.orig" | while read -r kv; do sysctl -qw "$kv" 2>/dev/null || true; done
		rm -f "$S/sysctl.orig"
	fi
	if awk -v s="$S/" 'index($5, s) == 1' /proc/self/mountinfo | grep -q .; then
		die "mounts remain under $S"
	fi
	# Certificates and images stay for the next start; the rest goes.
	rm -rf "$S/pids" "$S/etcd" "$S/containerd" "$S/containerd-run" "$S/containerd-opt" "$S"/*.sock "$S"/*.ttrpc \
		"$S/runc" "$S/kubelet" "$S/kubelet-plugins" "$S/pod-logs" "$S/cni-ipam" "$S/kubectl-cache"
	say "stopped; the host is as before"
}

case $cmd in
start) start ;;
import) import "$@" ;;
stop) stop ;;
*) die "usage: k8s-node.sh start|stop|import STATE_DIR [IMAGE...]" ;;
esac
