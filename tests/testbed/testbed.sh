#!/usr/bin/env bash
# A real two-node Slurm cluster (slurmctld + slurmdbd on MariaDB + one slurmd
# per node, munge, typed GPU GRES backed by fake /dev/nvidiaN character
# devices) that the portal reaches over SSH as the unprivileged user
# "gpuportal". Both nodes live on this machine: two slurmd, one per node name
# (slurmd -N), each on its own port, spool dir, pid and log file (Debian's
# Slurm is built with multiple-slurmd support), so that jobs can span 2 nodes.
# srun wires MPI ranks through PMIx (MpiDefault=pmix); LAMMPS on Open MPI is
# installed as the nodes' MPI program. slurmrestd (the REST peer that bench/peers.py measures the
# portal against) listens on $REST_HOST:$REST_PORT as the unprivileged user "slurmrestd", taking
# JWTs from "scontrol token" (AuthAltTypes=auth/jwt in slurm.conf and slurmdbd.conf).
#
# Jobs never run as "gpuportal": every job runs as a job identity, a Unix user in the group
# "portal-jobs" with a Slurm association under its own tenant's account only. "gpuportal" reaches
# them through one sudoers rule (sudo -n -u <identity> -- sbatch|scancel|tail|find|mkdir), keeps
# Operator for sacctmgr, and may submit nothing itself (MaxSubmitJobs=0). slurm.conf and
# slurmdbd.conf say PrivateData=jobs,usage,users,accounts, so an identity sees its own jobs only.
# Two tenants' identities come up with the testbed (accounts alpha and beta, users pt-alpha and
# pt-beta); `testbed.sh identity NAME` adds another job identity (tests make pt-<tenant slug>).
#
#   testbed.sh up      install what is missing, start everything, wait until a
#                      GPU job runs, write $STATE/testbed.env (idempotent; fast
#                      when already up)
#   testbed.sh down    stop the daemons this script started (by pid file);
#                      MariaDB is left alone
#   testbed.sh status  one line per daemon; exit 0 only when all run
#   testbed.sh identity NAME   make NAME a job identity (a Unix user in portal-jobs; idempotent)
#   testbed.sh ctld-stop   stop slurmctld alone, for a fault test's outage (idempotent);
#                      until ctld-start, or for at most OUTAGE_MAX_S, `up` waits for the
#                      outage to end instead of restarting slurmctld under the test
#   testbed.sh ctld-start  start slurmctld again, wait until it and the nodes answer
#                      (idempotent)
#
# State (keys, pid files, logs, sshd config, env file) lives in
# ${TESTBED_DIR:-<repo root>/var/testbed}; Slurm's config goes to /etc/slurm so
# that sbatch & co. find it over SSH without SLURM_CONF. Must run as root.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/../.." && pwd)
STATE_IN=${TESTBED_DIR:-$REPO_ROOT/var/testbed}

CLUSTER=portaltest
ACCOUNT=portal
PORTAL_USER=gpuportal
SSH_HOST=127.0.0.1
SSH_PORT=2222
PARTITIONS="h100:h100:4,a100:a100:4" # name:GPU type:GPUs per node; every partition has all nodes
NODE=$(hostname -s)
NODES=("$NODE" "${NODE}2") # node names; both slurmd run here, reached at $SSH_HOST
# A third node of its own partition (SHARE_PARTITION) whose GPUs are shared (issue [Share]): two
# whole "h200", MIG instances as typed GRES (two 3g.71gb, two 1g.18gb: as AutoDetect=nvml names
# them), and SHARDS_PER_GPU shards on each whole h200 (gres/shard), all on fake character devices.
SHARE_NODE="${NODE}3"
SHARE_PARTITION=h200
SHARDS_PER_GPU=4
ALL_NODES=("${NODES[@]}" "$SHARE_NODE")
SLURMD_PORTS=(6818 6820 6821) # one per node of ALL_NODES (6819 is slurmdbd's)
NODELIST=$(
    IFS=,
    echo "${NODES[*]}"
)
ALL_NODELIST="$NODELIST,$SHARE_NODE"
NCPUS=16 # declared (SlurmdParameters=config_overrides), so that many small jobs run at once
SLURM_ETC=/etc/slurm
SPOOL=/var/spool/slurm-testbed # outside the state dir: slurmstepd execs job scripts from here as the job user
DB_NAME=slurm_acct_db
DB_USER=slurm
MYSQL_HOST=127.0.0.1
MYSQL_PORT=3306
WAIT_S=${TESTBED_WAIT_S:-60}
OUTAGE_MAX_S=${TESTBED_OUTAGE_MAX_S:-120} # a fault test that died mid-outage leaves a stale marker
# libpmix-dev: MpiDefault=pmix, and Debian's mpi/pmix plugin dlopens the unversioned libpmix.so that only
# the -dev package ships. lammps (with Open MPI): the MPI program of the multi-node test (tests/jobs/test_multinode.py).
# slurm-wlm-jwt-plugin: auth/jwt, which Debian ships apart from slurmrestd's rest_auth/jwt.
# sudo: the service user's one rule to act as job identities.
PACKAGES=(munge slurm-wlm slurmdbd openssh-server libpmix-dev lammps slurmrestd slurm-wlm-jwt-plugin sudo)
SLURMDS=("${ALL_NODES[@]/#/slurmd-}") # daemon names: slurmd-<node>
DAEMONS=(munged slurmdbd slurmctld "${SLURMDS[@]}" slurmrestd sshd)
REST_USER=slurmrestd # slurmrestd refuses root and SlurmUser (and their groups)
REST_HOST=127.0.0.1
REST_PORT=6830
REST_API=v0.0.38 # the newest OpenAPI plugin of Slurm 22.05 (slurmrestd -s list)
JWT_KEY=$SLURM_ETC/jwt_hs256.key
JOB_GROUP=portal-jobs
# Jobs' directories: <scratch>/<identity>/<account>. The root is root's, searchable by all and
# listable and writable by none (0711); each identity's tree <scratch>/<identity> (0700) is made
# with the identity, by root, so that no identity can make (squat) another's; the portal refuses
# a tree its identity does not own.
SCRATCH=$SPOOL/portal-jobs
IDENTITIES=(alpha:pt-alpha beta:pt-beta) # account:identity, made at every `up`
SUDOERS=/etc/sudoers.d/gpuportal-testbed

log() { echo "[testbed] $*" >&2; }
die() {
    echo "[testbed] ERROR: $*" >&2
    exit 1
}

[[ $(id -u) == 0 ]] || die "must run as root"

mkdir -p "$STATE_IN"
STATE=$(cd "$STATE_IN" && pwd)
RUN_DIR=$STATE/run
LOG_DIR=$STATE/log
SSH_DIR=$STATE/ssh
ENV_FILE=$STATE/testbed.env
KEY_FILE=$SSH_DIR/${PORTAL_USER}_ed25519
HOST_KEY=$SSH_DIR/ssh_host_ed25519_key
KNOWN_HOSTS=$SSH_DIR/known_hosts
SSHD_CONFIG=$SSH_DIR/sshd_config
DB_PASS_FILE=$STATE/slurmdbd.pass
OUTAGE=$STATE/ctld-outage # present while a fault test holds slurmctld stopped

pidfile() { echo "$RUN_DIR/$1.pid"; }
logfile() {
    case $1 in
    munged) echo /var/log/munge/munged.log ;;
    *) echo "$LOG_DIR/$1.log" ;;
    esac
}

# alive and not a zombie waiting to be reaped
alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]]
}

# pid of a daemon we started, if it is alive (and is still that program: "slurmd-vm2" is a slurmd)
daemon_pid() {
    local f pid
    f=$(pidfile "$1")
    [[ -s $f ]] || return 1
    pid=$(tr -dc '0-9' <"$f")
    [[ -n $pid ]] && alive "$pid" || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "${1%%-*}" ]] || return 1
    echo "$pid"
}

tail_log() {
    local f
    f=$(logfile "$1")
    if [[ -f $f ]]; then
        echo "----- last lines of $f -----" >&2
        tail -n 25 "$f" >&2 || true
        echo "-----" >&2
    else
        echo "(no log file $f)" >&2
    fi
}

fail_daemon() { # daemon message
    echo "[testbed] ERROR: $2" >&2
    tail_log "$1"
    exit 1
}

# wait_for <seconds> <command...>: retry every 0.25 s until it succeeds
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.25
    done
}

# shellcheck disable=SC2120 # arguments come through wait_for
mysql_root() { mysql --protocol=TCP -h "$MYSQL_HOST" -P "$MYSQL_PORT" -uroot "$@"; }

# ---------------------------------------------------------------- packages --
pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

ensure_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do pkg_installed "$p" || missing+=("$p"); done
    command -v mysql >/dev/null || command -v mariadb >/dev/null || missing+=(mariadb-client)
    ((${#missing[@]})) || return 0
    log "installing ${missing[*]}"
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [[ ! -e $policy ]]; then
        # keep the packages' init scripts from starting daemons we don't control
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        created_policy=1
    fi
    local rc=0 apt=(apt-get install -y -q --no-install-recommends
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
    export DEBIAN_FRONTEND=noninteractive
    if ! compgen -G "/var/lib/apt/lists/*_Packages" >/dev/null; then
        apt-get update -q || rc=$?
    fi
    if ((rc == 0)) && ! "${apt[@]}" "${missing[@]}"; then
        apt-get update -q && "${apt[@]}" "${missing[@]}" || rc=$?
    fi
    ((created_policy)) && rm -f "$policy"
    ((rc == 0)) || die "apt-get install ${missing[*]} failed (rc=$rc)"
    command -v mysql >/dev/null || ln -sf "$(command -v mariadb)" /usr/local/bin/mysql
}

# ----------------------------------------------------------------- devices --
# 22 fake GPUs: per node 4 "h100" and 4 "a100", and the share node's 6 (gres.conf)
ensure_devices() {
    local n
    for n in {0..21}; do
        if [[ ! -c /dev/nvidia$n ]]; then
            rm -f "/dev/nvidia$n"
            mknod -m 666 "/dev/nvidia$n" c 195 "$n"
        fi
    done
}

# ------------------------------------------------------------ user and ssh --
ensure_user_and_keys() {
    if ! id -u "$PORTAL_USER" >/dev/null 2>&1; then
        log "creating user $PORTAL_USER"
        useradd --create-home --shell /bin/bash "$PORTAL_USER"
    fi
    # "*" = no password, but not "locked" (sshd with UsePAM no refuses locked accounts)
    [[ $(getent shadow "$PORTAL_USER" | cut -d: -f2) == "*" ]] || usermod -p '*' "$PORTAL_USER"
    local home
    home=$(getent passwd "$PORTAL_USER" | cut -d: -f6)
    [[ -d $home ]] || install -d -o "$PORTAL_USER" -g "$PORTAL_USER" -m 755 "$home"

    install -d -m 700 "$SSH_DIR"
    [[ -s $KEY_FILE && -s $KEY_FILE.pub ]] ||
        { rm -f "$KEY_FILE" "$KEY_FILE.pub"; ssh-keygen -q -t ed25519 -N '' -C "$PORTAL_USER@testbed" -f "$KEY_FILE"; }
    [[ -s $HOST_KEY && -s $HOST_KEY.pub ]] ||
        { rm -f "$HOST_KEY" "$HOST_KEY.pub"; ssh-keygen -q -t ed25519 -N '' -C "testbed-host" -f "$HOST_KEY"; }
    chown root:root "$KEY_FILE" "$HOST_KEY"
    chmod 600 "$KEY_FILE" "$HOST_KEY"

    install -d -o "$PORTAL_USER" -g "$PORTAL_USER" -m 700 "$home/.ssh"
    install -o "$PORTAL_USER" -g "$PORTAL_USER" -m 600 "$KEY_FILE.pub" "$home/.ssh/authorized_keys"
    id -u "$REST_USER" >/dev/null 2>&1 ||
        useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$REST_USER"

    echo "[$SSH_HOST]:$SSH_PORT $(cut -d' ' -f1,2 "$HOST_KEY.pub")" >"$KNOWN_HOSTS"
    chmod 644 "$KNOWN_HOSTS"
}

# -------------------------------------------------------- job identities --
# identity NAME: a Unix user in $JOB_GROUP with a group of its own, no home, no login shell, and
# its tree in the scratch root
ensure_identity() {
    [[ $1 =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] || die "invalid identity name '$1'"
    getent group "$JOB_GROUP" >/dev/null || groupadd --system "$JOB_GROUP"
    if ! id -u "$1" >/dev/null 2>&1; then
        useradd --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
            --groups "$JOB_GROUP" "$1" 2>/dev/null || id -u "$1" >/dev/null 2>&1 || die "useradd $1 failed"
    fi
    id -nG "$1" | tr ' ' '\n' | grep -qx "$JOB_GROUP" || usermod -aG "$JOB_GROUP" "$1"
    install -d -m 0711 -o root -g root "$SCRATCH"
    install -d -m 0700 -o "$1" -g "$1" "$SCRATCH/$1"
}

sudoers_text() {
    cat <<EOF
# generated by tests/testbed/testbed.sh: the portal's service user may run exactly these programs,
# as members of $JOB_GROUP only (never as root or as itself), without a password or a tty
Defaults:$PORTAL_USER !requiretty, !lecture, env_reset
$PORTAL_USER ALL=(%$JOB_GROUP) NOPASSWD: /usr/bin/sbatch, /usr/bin/scancel, /usr/bin/tail, /usr/bin/find, /usr/bin/mkdir
EOF
}

ensure_identities() {
    local pair
    for pair in "${IDENTITIES[@]}"; do ensure_identity "${pair#*:}"; done
    if [[ ! -f $SUDOERS || "$(cat "$SUDOERS")" != "$(sudoers_text)" ]]; then
        sudoers_text >"$SUDOERS.tmp"
        chmod 440 "$SUDOERS.tmp"
        visudo -c -q -f "$SUDOERS.tmp" || die "visudo rejects the generated $SUDOERS"
        mv -f "$SUDOERS.tmp" "$SUDOERS"
    fi
}

# ------------------------------------------------------------------- munge --
ensure_munge_files() {
    install -d -o munge -g munge -m 700 /etc/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating munge key"
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile=/etc/munge/munge.key
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        fi
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    install -d -o munge -g munge -m 755 /run/munge
    install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
}

start_munged() {
    daemon_pid munged >/dev/null && return 0
    ensure_munge_files
    local pid
    pid=$({ tr -dc "0-9" </run/munge/munged.pid; } 2>/dev/null || true)
    if [[ -n $pid ]] && alive "$pid" && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == munged ]]; then
        # e.g. started by the package's init script: adopt it rather than fight over the socket
        log "adopting running munged (pid $pid)"
    else
        log "starting munged"
        runuser -u munge -- /usr/sbin/munged 9>&- ||
            fail_daemon munged "munged did not start (another munged running?)"
    fi
    wait_for 10 test -s /run/munge/munged.pid || fail_daemon munged "munged wrote no pid file"
    cp /run/munge/munged.pid "$(pidfile munged)"
    wait_for 10 bash -c 'munge -n | unmunge' || fail_daemon munged "munge credentials do not work"
}

# ----------------------------------------------------------------- MariaDB --
ensure_database() {
    if [[ ! -s $DB_PASS_FILE ]]; then
        (umask 077 && head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$DB_PASS_FILE")
    fi
    local pw
    pw=$(cat "$DB_PASS_FILE")
    wait_for 30 mysql_root -e "SELECT 1" ||
        die "MariaDB does not answer on $MYSQL_HOST:$MYSQL_PORT as root without password"
    mysql_root <<EOF
CREATE DATABASE IF NOT EXISTS \`$DB_NAME\`;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$pw';
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$pw';
ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$pw';
ALTER USER '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$pw';
GRANT ALL PRIVILEGES ON \`$DB_NAME\`.* TO '$DB_USER'@'localhost';
GRANT ALL PRIVILEGES ON \`$DB_NAME\`.* TO '$DB_USER'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
}

# The configuration files' text and their writing: configs.sh, beside this script.
# shellcheck source=tests/testbed/configs.sh
source "$(dirname "${BASH_SOURCE[0]}")/configs.sh"

# ------------------------------------------------------------ slurm daemons --
sacctmgr_q() { sacctmgr -n -P "$@"; }

start_slurmdbd() {
    if ! daemon_pid slurmdbd >/dev/null; then
        log "starting slurmdbd"
        /usr/sbin/slurmdbd 9>&- || fail_daemon slurmdbd "slurmdbd did not start"
    fi
    wait_for "$WAIT_S" sacctmgr_q list cluster format=cluster ||
        fail_daemon slurmdbd "slurmdbd does not answer sacctmgr within ${WAIT_S}s"
    if ! sacctmgr_q list cluster format=cluster | grep -qx "$CLUSTER"; then
        log "adding cluster $CLUSTER to the accounting database"
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
    if ! sacctmgr_q list account "$ACCOUNT" format=account | grep -qx "$ACCOUNT"; then
        log "adding account $ACCOUNT"
        sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" \
            description="GPU portal" organization=portal >/dev/null
    fi
    if ! sacctmgr_q list assoc cluster="$CLUSTER" account="$ACCOUNT" user="$PORTAL_USER" format=user |
        grep -qx "$PORTAL_USER"; then
        log "adding user $PORTAL_USER to account $ACCOUNT (operator)"
        sacctmgr -i add user "$PORTAL_USER" account="$ACCOUNT" cluster="$CLUSTER" \
            defaultaccount="$ACCOUNT" adminlevel=operator >/dev/null
    fi
    if ! sacctmgr_q list user "$PORTAL_USER" format=adminlevel | grep -qix operator; then
        sacctmgr -i modify user "$PORTAL_USER" set adminlevel=operator >/dev/null
    fi
    # The service user manages accounts; it runs no job, not even by mistake.
    if ! sacctmgr_q list assoc account="$ACCOUNT" user="$PORTAL_USER" format=MaxSubmit | grep -qx 0; then
        sacctmgr -i modify user where name="$PORTAL_USER" account="$ACCOUNT" set MaxSubmitJobs=0 >/dev/null
    fi
    local pair
    for pair in "${IDENTITIES[@]}"; do
        if ! sacctmgr_q list account "${pair%%:*}" format=account | grep -qx "${pair%%:*}"; then
            sacctmgr -i add account "${pair%%:*}" parent="$ACCOUNT" cluster="$CLUSTER" >/dev/null
        fi
        if ! sacctmgr_q list assoc account="${pair%%:*}" user="${pair#*:}" format=user | grep -qx "${pair#*:}"; then
            sacctmgr -i add user "${pair#*:}" account="${pair%%:*}" cluster="$CLUSTER" >/dev/null
        fi
    done
    # One QOS per tenant tier, rising priority. An operator may not create QOS in Slurm, so the
    # site's administrator makes them once, as here (README: what a Slurm admin sets up).
    # Below them the borrowing QOS (lending, docs/architecture/lending.md), which every tier
    # preempts: its jobs get their --signal at once and GraceTime, then are requeued.
    sacctmgr_q list qos portal-borrow format=name | grep -qx portal-borrow ||
        sacctmgr -i add qos portal-borrow priority=0 preemptmode=requeue gracetime=300 >/dev/null
    for q in portal-low:10 portal-normal:100 portal-high:1000 portal-critical:10000; do
        sacctmgr_q list qos "${q%%:*}" format=name | grep -qx "${q%%:*}" ||
            sacctmgr -i add qos "${q%%:*}" priority="${q##*:}" >/dev/null
        sacctmgr_q list qos "${q%%:*}" format=preempt | grep -qx portal-borrow ||
            sacctmgr -i modify qos where name="${q%%:*}" set preempt=portal-borrow >/dev/null
    done
}

ctld_ok() { scontrol ping 2>/dev/null | grep -q "is UP"; }

# e.g. "vm:idle vm2:mixed"
node_states() { sinfo -h -N -n "$ALL_NODELIST" -o %N:%T 2>/dev/null | awk '!seen[$0]++' | tr '\n' ' ' | sed 's/ $//'; }

nodes_usable() {
    local states node
    states=" $(node_states) "
    for node in "${ALL_NODES[@]}"; do
        [[ $states =~ \ $node:(idle|mixed|allocated|completing)\  ]] || return 1
    done
}

start_slurmctld() {
    if ! daemon_pid slurmctld >/dev/null; then
        log "starting slurmctld"
        /usr/sbin/slurmctld 9>&- || fail_daemon slurmctld "slurmctld did not start"
    fi
    wait_for "$WAIT_S" ctld_ok || fail_daemon slurmctld "slurmctld does not answer 'scontrol ping' within ${WAIT_S}s"
}

start_slurmds() {
    local node
    for node in "${ALL_NODES[@]}"; do
        if ! daemon_pid "slurmd-$node" >/dev/null; then
            log "starting slurmd for node $node"
            /usr/sbin/slurmd -N "$node" 9>&- || fail_daemon "slurmd-$node" "slurmd -N $node did not start"
        fi
    done
    if ! wait_for 20 nodes_usable; then
        # e.g. DOWN after an unclean stop: ReturnToService=2 should cover it, nudge anyway
        scontrol update nodename="$ALL_NODELIST" state=resume >/dev/null 2>&1 || true
        wait_for "$WAIT_S" nodes_usable ||
            fail_daemon "slurmd-$NODE" "nodes are '$(node_states)', not all idle, after ${WAIT_S}s ($(sinfo -h -R 2>/dev/null | tr -s ' ' | head -n1))"
    fi
}

# an authenticated ping through slurmrestd to slurmctld, with a short-lived token of the portal user
# (sent on stdin, not argv: tokens are secrets)
rest_ok() {
    local token
    token=$(scontrol token username="$PORTAL_USER" lifespan=60 2>/dev/null) || return 1
    printf 'X-SLURM-USER-NAME: %s\nX-SLURM-USER-TOKEN: %s\n' "$PORTAL_USER" "${token#SLURM_JWT=}" |
        curl -fsS -o /dev/null --max-time 5 -H @- "http://$REST_HOST:$REST_PORT/slurm/$REST_API/ping"
}

start_slurmrestd() {
    if ! daemon_pid slurmrestd >/dev/null; then
        log "starting slurmrestd on $REST_HOST:$REST_PORT as $REST_USER"
        # slurmrestd stays in the foreground: background it here; setsid and setpriv exec, so $! is its pid.
        # MALLOC_ARENA_MAX: each of its 20 threads keeps ~240 MB after one list of 5,000 jobs otherwise
        SLURM_JWT=daemon MALLOC_ARENA_MAX=2 setsid setpriv --reuid="$REST_USER" --regid="$REST_USER" --clear-groups \
            /usr/sbin/slurmrestd -a rest_auth/jwt -s "openapi/$REST_API,openapi/db$REST_API" \
            "$REST_HOST:$REST_PORT" </dev/null >>"$(logfile slurmrestd)" 2>&1 9>&- &
        echo $! >"$(pidfile slurmrestd)"
    fi
    wait_for 20 rest_ok || fail_daemon slurmrestd "slurmrestd does not answer a JWT ping on $REST_HOST:$REST_PORT"
}

start_sshd() {
    daemon_pid sshd >/dev/null && return 0
    install -d -m 755 /run/sshd
    /usr/sbin/sshd -t -f "$SSHD_CONFIG" || die "sshd rejects $SSHD_CONFIG"
    log "starting sshd on $SSH_HOST:$SSH_PORT"
    /usr/sbin/sshd -f "$SSHD_CONFIG" -E "$(logfile sshd)" 9>&- || fail_daemon sshd "sshd did not start"
    wait_for 10 daemon_pid sshd || fail_daemon sshd "sshd wrote no pid file"
}

ssh_portal() {
    ssh -q -i "$KEY_FILE" -p "$SSH_PORT" -o BatchMode=yes -o IdentitiesOnly=yes \
        -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$KNOWN_HOSTS" -o GlobalKnownHostsFile=/dev/null \
        -o ConnectTimeout=10 "$PORTAL_USER@$SSH_HOST" "$@"
}

# submit a job of 1 GPU on each node over SSH as the portal user, through its sudo rule as the
# first job identity (as the portal does), with a step on both nodes, and wait until it completed
smoke_job() {
    local out id state deadline=$((SECONDS + WAIT_S)) pair=${IDENTITIES[0]}
    out=$(printf '#!/bin/sh\nset -e\ntest -n "$CUDA_VISIBLE_DEVICES"\nsrun --ntasks-per-node=1 true\n' |
        ssh_portal sudo -n -u "${pair#*:}" -- sbatch --parsable --account="${pair%%:*}" --partition=h100 \
            --gres=gpu:h100:1 --nodes=${#NODES[@]} --time=1 --job-name=testbed-smoke --chdir=/tmp \
            --output=/dev/null 2>&1) ||
        { tail_log sshd; die "smoke job submission over SSH failed: $out"; }
    id=${out%%;*}
    [[ $id =~ ^[0-9]+$ ]] || die "unexpected sbatch output: $out"
    while :; do
        state=$(scontrol show job "$id" -o 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true)
        case $state in
        COMPLETED) return 0 ;;
        FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
            scontrol show job "$id" >&2 || true
            fail_daemon "slurmd-$NODE" "smoke job $id ended $state"
            ;;
        esac
        if ((SECONDS >= deadline)); then
            scontrol show job "$id" >&2 || true
            scancel "$id" 2>/dev/null || true
            fail_daemon slurmctld "smoke job $id still '$state' after ${WAIT_S}s"
        fi
        sleep 0.25
    done
}

env_file_text() {
    cat <<EOF
SLURM_TESTBED_HOST=$SSH_HOST
SLURM_TESTBED_PORT=$SSH_PORT
SLURM_TESTBED_USER=$PORTAL_USER
SLURM_TESTBED_KEY_FILE=$KEY_FILE
SLURM_TESTBED_KNOWN_HOSTS=$KNOWN_HOSTS
SLURM_TESTBED_CLUSTER=$CLUSTER
SLURM_TESTBED_ACCOUNT=${IDENTITIES[0]%%:*}
SLURM_TESTBED_IDENTITY=${IDENTITIES[0]#*:}
SLURM_TESTBED_OTHER_ACCOUNT=${IDENTITIES[1]%%:*}
SLURM_TESTBED_OTHER_IDENTITY=${IDENTITIES[1]#*:}
SLURM_TESTBED_PARENT_ACCOUNT=$ACCOUNT
SLURM_TESTBED_SCRATCH=$SCRATCH
SLURM_TESTBED_JOB_GROUP=$JOB_GROUP
SLURM_TESTBED_PARTITIONS=$PARTITIONS
SLURM_TESTBED_NODES=${#NODES[@]}
SLURM_TESTBED_SHARE_PARTITION=$SHARE_PARTITION
SLURM_TESTBED_SHARE_NODE=$SHARE_NODE
SLURM_TESTBED_SHARDS_PER_GPU=$SHARDS_PER_GPU
SLURMRESTD_URL=http://$REST_HOST:$REST_PORT
SLURMRESTD_API=$REST_API
SLURMRESTD_USER=${IDENTITIES[0]#*:}
EOF
}

write_env_file() { write_if_changed "$ENV_FILE" 644 "$(env_file_text)" || true; }

all_up() {
    local d
    for d in "${DAEMONS[@]}"; do daemon_pid "$d" >/dev/null || return 1; done
    [[ -s $KEY_FILE && -s $KNOWN_HOSTS && -f $ENV_FILE && "$(cat "$ENV_FILE")" == "$(env_file_text)" ]] || return 1
    configs_current || return 1
    [[ -f $SUDOERS && "$(cat "$SUDOERS")" == "$(sudoers_text)" && $(stat -c %a "$SCRATCH" 2>/dev/null) == 711 ]] ||
        return 1
    local pair
    for pair in "${IDENTITIES[@]}"; do [[ -d $SCRATCH/${pair#*:} ]] || return 1; done
    ctld_ok && nodes_usable
}

stop_daemon() {
    local pid i
    pid=$(daemon_pid "$1") || { rm -f "$(pidfile "$1")"; return 0; }
    log "stopping $1 (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
        alive "$pid" || break
        sleep 0.1
    done
    if alive "$pid"; then
        log "$1 (pid $pid) ignored SIGTERM, killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$(pidfile "$1")"
}

stop_slurm() {
    local d
    stop_daemon slurmrestd # it read slurm.conf at its start
    for d in "${SLURMDS[@]}" slurmd; do stop_daemon "$d"; done # slurmd: the one-node testbed's pid file
    stop_daemon slurmctld
    stop_daemon slurmdbd
}

# ---------------------------------------------------------------- commands --
cmd_up() {
    local t0=$SECONDS
    if all_up; then
        log "already up ($ENV_FILE)"
        return 0
    fi
    install -d -m 755 "$RUN_DIR" "$LOG_DIR"
    ensure_packages
    ensure_devices
    ensure_user_and_keys
    ensure_identities
    start_munged
    ensure_database
    if write_configs; then
        # Slurm config changed under running daemons: restart them
        local d
        for d in "${SLURMDS[@]}" slurmd slurmctld slurmdbd; do
            if daemon_pid "$d" >/dev/null; then
                log "configuration changed, restarting Slurm daemons"
                stop_slurm
                break
            fi
        done
    fi
    if daemon_pid sshd >/dev/null && ! /usr/sbin/sshd -t -f "$SSHD_CONFIG"; then
        stop_daemon sshd
    fi
    start_slurmdbd
    start_slurmctld
    start_slurmds
    start_slurmrestd
    start_sshd
    ssh_portal true || { tail_log sshd; die "cannot log in as $PORTAL_USER over SSH on $SSH_HOST:$SSH_PORT"; }
    smoke_job
    write_env_file
    log "up in $((SECONDS - t0))s; connection details in $ENV_FILE"
}

cmd_down() {
    if daemon_pid slurmctld >/dev/null && ctld_ok; then
        # don't leave job steps running without a slurmd
        local ids
        ids=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ' || true)
        if [[ -n ${ids// /} ]]; then
            log "cancelling jobs $ids"
            # shellcheck disable=SC2086
            scancel $ids 2>/dev/null || true
            wait_for 15 bash -c '[[ -z $(squeue -h -t R,CG -o %i 2>/dev/null) ]]' || true
        fi
    fi
    stop_daemon sshd
    stop_slurm
    stop_daemon munged
    log "down"
}

cmd_status() {
    local d pid rc=0
    for d in "${DAEMONS[@]}"; do
        if pid=$(daemon_pid "$d"); then
            echo "$d: running (pid $pid)"
        else
            echo "$d: stopped"
            rc=1
        fi
    done
    if ((rc == 0)); then
        if ctld_ok; then
            echo "cluster $CLUSTER: slurmctld answers; nodes $(node_states)"
            nodes_usable || rc=1
        else
            echo "cluster $CLUSTER: slurmctld does not answer"
            rc=1
        fi
        [[ -s $ENV_FILE ]] && echo "env file: $ENV_FILE" || { echo "env file: missing"; rc=1; }
    fi
    return $rc
}

# ------------------------------------------------------ slurmctld outage --
cmd_ctld_stop() {
    touch "$OUTAGE"
    stop_daemon slurmctld
    # the client side of the outage: commands must now fail, not find a controller
    wait_for 10 bash -c '! scontrol ping 2>/dev/null | grep -q "is UP"' || die "slurmctld still answers"
}

cmd_ctld_start() {
    install -d -m 755 "$RUN_DIR" "$LOG_DIR"
    start_slurmctld
    start_slurmds # waits until the nodes registered again (and starts a slurmd that died meanwhile)
    rm -f "$OUTAGE"
}

outage_fresh() {
    local since
    since=$(stat -c %Y "$OUTAGE" 2>/dev/null) || return 1
    (($(date +%s) - since < OUTAGE_MAX_S)) && return 0
    log "slurmctld outage marker is older than ${OUTAGE_MAX_S}s: ending the outage"
    rm -f "$OUTAGE"
    return 1
}

# serialise concurrent up/down (e.g. parallel test workers)
lock() {
    exec 9>"$STATE/.lock"
    flock -w 900 9 || die "could not lock $STATE/.lock"
}

# up, but not during a fault test's slurmctld outage: wait for its end without holding the
# lock (ctld-start takes it), then check again under the lock, since ctld-stop may have won it.
up_after_outage() {
    local deadline=$((SECONDS + OUTAGE_MAX_S + 5))
    while :; do
        while outage_fresh && ((SECONDS < deadline)); do sleep 0.25; done
        lock
        if ! outage_fresh || ((SECONDS >= deadline)); then break; fi
        flock -u 9
    done
    cmd_up
}

case ${1:-} in
up) up_after_outage ;;
down) lock && cmd_down ;;
status) cmd_status ;;
identity)
    [[ -n ${2:-} ]] || die "usage: $0 identity NAME"
    ensure_identity "$2"
    ;;
ctld-stop) lock && cmd_ctld_stop ;;
ctld-start) lock && cmd_ctld_start ;;
*)
    echo "usage: $0 up|down|status|identity NAME|ctld-stop|ctld-start" >&2
    exit 2
    ;;
esac
