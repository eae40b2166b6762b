#!/usr/bin/env bash
# Builds (once) and caches the Debian bookworm guest that `make test-node` boots
# under QEMU: systemd as PID 1, the unified cgroup v2 hierarchy, Debian's
# containerd 1.6, runc and CNI plugins, plus the pinned containerd 2.4, kubelet
# and crictl from hack/install-deps.sh's tools cache. Nothing of inplaced is in
# the image: the test carries it in on each run (9p), so the image only changes
# when this script, the package list or a pinned tool does.
#
# Cache: ${INPLACED_VM_CACHE:-/var/cache/inplaced/vm}/<key>/{root.img,vmlinuz,initrd.img}
# where <key> hashes this script and the baked-in tool binaries; a changed input
# builds a new image (~2-4 min on 2 cores, mostly the mirror) and images older
# than a day are removed. Prints the image directory.
#
# Usage: hack/vm/build-image.sh        (root; needs network to the Debian mirror
#                                       on the first run only)
set -euo pipefail

TOOLS="${INPLACED_TOOLS:-/var/cache/inplaced/tools}"
CACHE="${INPLACED_VM_CACHE:-/var/cache/inplaced/vm}"
MIRROR="${INPLACED_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
IMAGE_SIZE=4G
CONTAINERD2="${TOOLS}/containerd-${CONTAINERD_VERSION:-v2.4.2}/bin"
KUBELET="${TOOLS}/kubelet-${KUBELET_VERSION:-v1.37.2}/kubelet"
CRICTL="${TOOLS}/bin/crictl"
PACKAGES=(systemd-sysv udev dbus linux-image-amd64 kmod iproute2 iptables procps
	runc containerd containernetworking-plugins busybox-static nftables)
HOST_PACKAGES=(qemu-system-x86 qemu-utils mmdebstrap e2fsprogs)

log() { printf '[vm-image] %s\n' "$*" >&2; }

[[ $(id -u) -eq 0 ]] || { log "needs root"; exit 1; }

missing=()
for p in "${HOST_PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q "install ok installed" || missing+=("${p}")
done
if ((${#missing[@]})); then
	log "apt-get install ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

baked=("${CONTAINERD2}/containerd" "${CONTAINERD2}/containerd-shim-runc-v2" "${KUBELET}" "${CRICTL}")
for f in "${baked[@]}"; do
	[[ -x ${f} ]] || { log "missing ${f}: run INPLACED_WITH_KUBELET=1 hack/install-deps.sh"; exit 1; }
done

key="$({
	cat "${BASH_SOURCE[0]}"
	sha256sum "${baked[@]}" | cut -d' ' -f1
} | sha256sum | cut -c1-16)"
dir="${CACHE}/${SUITE}-${key}"
if [[ -f ${dir}/.complete ]]; then
	log "image present: ${dir}"
	echo "${dir}"
	exit 0
fi
# One build at a time: a second make test-node waits for the first's image.
mkdir -p "${CACHE}"
exec 9>"${CACHE}/.lock"
flock 9
if [[ -f ${dir}/.complete ]]; then
	log "image present: ${dir}"
	echo "${dir}"
	exit 0
fi

start=${SECONDS}
mkdir -p "${CACHE}"
work="$(mktemp -d "${CACHE}/.build.XXXXXX")"
# --one-file-system: should mmdebstrap die with the chroot's /proc or /dev
# still mounted, the cleanup must not follow them.
trap 'rm -rf --one-file-system "${work}"' EXIT
rootfs="${work}/rootfs"

log "mmdebstrap ${SUITE} from ${MIRROR}"
# The hooks run on the host with the root filesystem at "$1". Debian's
# containerd is the node's containerd.service; the 2.4 binaries sit beside it
# and the test points the unit at them with a drop-in.
mmdebstrap --quiet --variant=apt --include="$(IFS=,; echo "${PACKAGES[*]}")" \
	--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--customize-hook='install -D -m 0755 '"${CONTAINERD2}"'/containerd "$1/opt/containerd-2.4/bin/containerd"' \
	--customize-hook='install -D -m 0755 '"${CONTAINERD2}"'/containerd-shim-runc-v2 "$1/opt/containerd-2.4/bin/containerd-shim-runc-v2"' \
	--customize-hook='install -D -m 0755 '"${KUBELET}"' "$1/usr/local/bin/kubelet"' \
	--customize-hook='install -D -m 0755 '"${CRICTL}"' "$1/usr/local/bin/crictl"' \
	--customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
	"${SUITE}" "${rootfs}" "${MIRROR}"

log "configure"
echo node >"${rootfs}/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 node\n' >"${rootfs}/etc/hosts"
printf '/dev/vda / ext4 rw,relatime 0 1\n' >"${rootfs}/etc/fstab"
: >"${rootfs}/etc/machine-id"
# No network, no timers, no login: nothing runs in the guest but the node and
# the test. The test's own unit (node-run.service) runs what the 9p share brings.
for unit in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer \
	man-db.timer systemd-tmpfiles-clean.timer serial-getty@ttyS0.service serial-getty@ttyS1.service \
	getty@tty1.service systemd-timesyncd.service networking.service; do
	ln -sf /dev/null "${rootfs}/etc/systemd/system/${unit}"
done
cat >"${rootfs}/etc/systemd/system/node-run.service" <<'UNIT'
[Unit]
Description=inplaced node test (runs /mnt/payload/run.sh from the host's 9p share, then powers off)
After=multi-user.target
ConditionKernelCommandLine=inplaced.node=1

[Service]
Type=oneshot
ExecStartPre=/bin/mkdir -p /mnt/payload
ExecStartPre=/bin/mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 payload /mnt/payload
ExecStart=/bin/sh /mnt/payload/run.sh
ExecStopPost=/bin/systemctl --no-block poweroff
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
UNIT
ln -sf ../node-run.service "${rootfs}/etc/systemd/system/multi-user.target.wants/node-run.service"
# 9p over virtio must be in the initrd-less root: load the modules at boot.
printf '9p\n9pnet_virtio\n' >"${rootfs}/etc/modules-load.d/9p.conf"

kernel="$(ls "${rootfs}"/boot/vmlinuz-* | sort -V | tail -1)"
initrd="$(ls "${rootfs}"/boot/initrd.img-* | sort -V | tail -1)"
cp "${kernel}" "${work}/vmlinuz"
cp "${initrd}" "${work}/initrd.img"
log "mkfs.ext4 ${IMAGE_SIZE}"
mkfs.ext4 -q -F -L node -d "${rootfs}" "${work}/root.img" "${IMAGE_SIZE}"
rm -rf --one-file-system "${rootfs}"

# Older images go once they are a day old: a checkout of another commit may
# still be booting one.
find "${CACHE}" -mindepth 1 -maxdepth 1 -name "${SUITE}-*" ! -name "${SUITE}-${key}" -mmin +1440 -exec rm -rf {} +
rm -rf "${dir}"
mkdir "${dir}"
mv "${work}/root.img" "${work}/vmlinuz" "${work}/initrd.img" "${dir}/"
printf 'key %s\nbuilt %s in %ss\n' "${key}" "$(date -u +%FT%TZ)" "$((SECONDS - start))" >"${dir}/.complete"
log "image built in $((SECONDS - start))s: ${dir}"
echo "${dir}"
