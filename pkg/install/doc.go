// Package install puts inplaced on a node and takes it off again, from a
// privileged pod that sees the host's root at a mount point (/host) and the
// host's processes (hostPID): what kata-deploy does for Kata, for a daemon
// that must run under the host's systemd and never in a pod, because it has
// to outlive kubelet and the runtime it stands between.
//
// # Decide, then do
//
// Inspect reads what is on the host (the files the plans touch, the units'
// states over systemd's D-Bus, kubelet's command line, the record of an
// earlier install, the Node's annotation) into Facts. PlanInstall and
// PlanUninstall are pure functions from Spec (what the image carries and the
// chart asks for) and Facts to a Plan; Executor runs it. A plan is a list of
// phases, each with its undo: the files a phase wrote or removed are put back
// from backups made beside them, and the phase's own undo steps (stop what
// was started, restart what was restarted, on the old files) run around
// that. A failed install is undone phase by phase back to the node as it
// was; what follows the checkpoint (the Node's annotation and Event) is never
// undone. An uninstall has no undo: each run plans from what is left, so a
// second run finishes what a first one could not.
//
// # What goes where
//
// The payload is what the image carries: the binaries, and the
// repository's host files at their repository paths. HostFiles maps it onto
// the host
// — the binaries, every unit under systemd/ (inplaced.service, and
// inplaced.socket where the release has one) — and the plan writes
// /etc/inplaced/config.yaml from deploy/inplaced/config.yaml, kubelet's unit
// drop-in from deploy/kubelet/10-inplaced.conf (k3s: deploy/k3s/...), and the
// record /etc/inplaced/installed.json: the version, the time, the endpoint
// kubelet used before, each KubeletConfiguration line as it was, every file
// written. The Node's annotation inplaced.io/installed carries the version,
// time and previous endpoint for the cluster's view; uninstall trusts the
// host's record first.
//
// # kubelet is restarted once
//
// kubelet (or k3s) reads its runtime endpoint when it starts. Before a plan
// changes the files that name it, the record stores the identity (main PID
// and start time, from systemd) of the kubelet then running; kubelet is
// restarted when this plan changes those files or when the kubelet running
// is still that one (a run cut between the change and the restart). Any
// other kubelet started after the change and has read it: a second run with
// everything in place restarts nothing, and an upgrade, which changes only
// inplaced's own files, restarts inplaced only.
package install
