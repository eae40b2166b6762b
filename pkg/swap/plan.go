package swap

import (
	"strings"

	"github.com/inplaced/inplaced/pkg/store"
)

// Step names, as shown to users and accepted by the crash test switch.
const (
	StepPull       = "pull"
	StepDrain      = "drain"
	StepPreStop    = "pre-stop"
	StepStopOld    = "stop-old"
	StepCreateNew  = "create-new"
	StepStartNew   = "start-new"
	StepPostStart  = "post-start"
	StepHealthGate = "health-gate"
	StepCommit     = "commit"
	StepRollback   = "rollback"
)

// Record kinds (SwapRecord.kind, the journal's Kind).
const (
	// KindSwap is a swap asked for by a caller: inplacectl swap, a request
	// on the pod, env from pod metadata.
	KindSwap = "swap"
	// KindRevert goes back to the configuration kubelet declared.
	KindRevert = "revert"
	// KindKubelet is the record kind of a swap that kubelet's own restart
	// of a container for a changed pod spec image was turned into.
	KindKubelet = "kubelet"
)

// action names what a step does; run.go maps each to its code (actions).
type action string

const (
	actPull            action = "pull the new image with the request's credentials"
	actPullKubelet     action = "pull the new image with the credentials kubelet would use, then tell kubelet's waiting stop"
	actProceed         action = "wait for kubelet's StopContainer, take the fence"
	actConfig          action = "build the new config: recorded config + change"
	actConfigSpec      action = "build the new config: recorded config + change, kubelet's hash for the new spec"
	actKubeletConfig   action = "build the new config: kubelet's declared config + image, kubelet's hash"
	actCreateNew       action = "create the new container, hidden from kubelet"
	actDrain           action = "run the caller's BeforeStop hook"
	actPreStop         action = "run the preStop handler"
	actHoldConnections action = "hold new connections to the container's ports until the new process listens"
	actRecordNoHold    action = "record why no connection hold is installed"
	actStopOld         action = "mask the old container, stop it"
	actStopOldKube     action = "mask the old container, stop it with kubelet's timeout"
	actStartNew        action = "start the new container"
	actPostStart       action = "run the postStart handler"
	actHealthGate      action = "wait for the new container to prove healthy"
	actCommit          action = "write the sticky override"
	actCommitRevert    action = "drop the sticky override"
	actCommitKubelet   action = "drop an override the spec change ended"
	actRollback        action = "remove the new container, create and start the old config again"
	actCreateTrapped   action = "write the bind trap's seccomp profile, register the old container with the agent, create the new container with the trap"
	actStartOverlap    action = "start the new container while the old one runs"
	actHandover        action = "wait until every port the old container listens on is handed over; else fall back to stop-first"
)

// undo names what brings the pod back to "the old container runs" from the
// state a step leaves (or leaves behind when it fails). Undos nest: each one
// undoes its step and every step before it, so the executor runs only the
// undo of the last step it reached.
type undo string

const (
	// undoNothing: nothing was touched; the swap ends FAILED.
	undoNothing undo = ""
	// undoRemoveNew: the old container still runs; the new one (if created)
	// is removed.
	undoRemoveNew undo = "remove the new container; the old one runs on"
	// undoRollback: the old container was stopped; the rollback plan
	// removes the new one and starts the old config again (after an abort,
	// only removes: kubelet's intent wins).
	undoRollback undo = "roll back: the rollback plan"
	// undoStepAside: the old container was stopped on kubelet's behalf; the
	// new one is removed and kubelet's own create follows.
	undoStepAside undo = "remove the new container; kubelet creates the container itself"
)

// step is one step of a swap's plan.
type step struct {
	// name is shown in records, events and metrics and accepted by the
	// crash switch; a step with no name is not shown (bookkeeping between
	// shown steps).
	name string
	// journal is written (fsync) before the action; "" for none.
	journal store.JournalStep
	do      action
	// undo is run when this step or a later one fails; see undo.
	undo undo
	// optional: a failure is recorded and the swap goes on (kubelet goes
	// on with a stop when preStop fails; so do we).
	optional bool
	// failure names the step in the swap's error when it fails.
	failure string
	// aborted, when set, is checked before the step: a swap aborted by
	// then (pod removed, kubelet stopped the container) ends with it.
	aborted string
}

// planSpec is what a plan depends on.
type planSpec struct {
	kind      string // KindSwap, KindRevert or KindKubelet
	drain     bool   // Hooks.BeforeStop is set
	specHash  bool   // Hooks.SpecHash is set
	preStop   bool   // the request does not skip preStop
	postStart bool   // the request has a postStart handler
	hold      bool   // a connection hold is planned (connectionHold)
	overlap   bool   // the overlap strategy runs (chooseStrategy)
}

// planFor returns the steps of a swap. It decides everything that depends
// on the kind of swap; run.execute only carries the plan out.
//
// The new container is created while the old one still runs: creating it
// (snapshot, spec) is work that need not be downtime, and containerd starts
// no process before StartContainer. A kubelet-driven swap has no health gate
// and no rollback: the spec declares the new image, so kubelet's probes and
// restart policy govern it, and rolling back to an image the spec no longer
// names would fight kubelet; it runs no preStop (kubelet already ran it).
func planFor(s planSpec) []step {
	kube := s.kind == KindKubelet
	if s.overlap {
		return overlapPlan(s)
	}
	afterStop, pullFailed := undoRollback, "pull failed, old container untouched"
	var plan []step
	if kube {
		afterStop = undoStepAside
		// Nothing is touched until kubelet's StopContainer: no journal
		// before the pull, and none while waiting.
		plan = append(plan,
			step{name: StepPull, do: actPullKubelet, failure: pullFailed},
			step{do: actProceed},
			step{journal: store.StepPrepared, do: actKubeletConfig})
	} else {
		config := actConfig
		if s.specHash {
			config = actConfigSpec
		}
		plan = append(plan,
			step{name: StepPull, journal: store.StepPrepared, do: actPull, failure: pullFailed},
			step{do: config})
	}
	plan = append(plan, step{name: StepCreateNew, journal: store.StepCreateNew, do: actCreateNew, undo: undoRemoveNew, failure: "create new container"})
	if s.drain {
		plan = append(plan, step{name: StepDrain, do: actDrain, undo: undoRemoveNew, optional: true})
	}
	if s.preStop && !kube {
		plan = append(plan, step{name: StepPreStop, journal: store.StepPreStop, do: actPreStop, undo: undoRemoveNew, optional: true})
	}
	// The hold goes on just before the stop: new connections wait from
	// there until the new process listens.
	connHold := step{do: actRecordNoHold, undo: undoRemoveNew, aborted: "aborted before the old container was stopped"}
	if s.hold {
		connHold.name, connHold.do, connHold.optional = StepConnectionHold, actHoldConnections, true
	}
	stop := map[bool]action{false: actStopOld, true: actStopOldKube}[kube]
	plan = append(plan, connHold,
		step{name: StepStopOld, journal: store.StepStopOld, do: stop, undo: afterStop, failure: "stop old container"},
		step{name: StepStartNew, journal: store.StepStartNew, do: actStartNew, undo: afterStop,
			failure: "start new container", aborted: "aborted after the old container was stopped"})
	const starting = "aborted while the new container was starting"
	if s.postStart {
		plan = append(plan, step{name: StepPostStart, do: actPostStart, undo: afterStop, failure: "postStart hook"})
	}
	if !kube {
		plan = append(plan, step{name: StepHealthGate, journal: store.StepHealthGate, do: actHealthGate, undo: afterStop, failure: "health gate"})
	}
	commit := map[string]action{KindSwap: actCommit, KindRevert: actCommitRevert, KindKubelet: actCommitKubelet}[s.kind]
	plan = append(plan, step{name: StepCommit, do: commit, undo: afterStop, optional: true})
	// The abort check after start-new guards whichever step follows it.
	for i := range plan {
		if plan[i].name == StepStartNew && plan[i+1].aborted == "" {
			plan[i+1].aborted = starting
		}
	}
	return plan
}

// Abort texts of the steps that check for an abort.
const (
	abortedBeforeStop = "aborted before the old container was stopped"
	abortedAfterStop  = "aborted after the old container was stopped"
)

// overlapPlan is the plan of an overlap swap: the new container is created
// with the bind trap and started while the old one runs, takes over the old
// one's listening sockets (handover) and, unless kubelet drives the swap
// (its probes judge the spec's image), proves healthy with both running;
// only then is the old one stopped, draining what it accepted. Until the
// stop every undo removes the new container: the old one never stopped
// accepting (kubelet's waiting stop then goes ahead as it asked). Nothing
// is journaled between start-new (StepOverlap) and the stop: recovery from
// there removes the new container. A handover that cannot complete goes on
// with fallbackPlan.
func overlapPlan(s planSpec) []step {
	kube := s.kind == KindKubelet
	plan := overlapHead(s)
	plan = append(plan,
		step{name: StepCreateNew, journal: store.StepCreateNew, do: actCreateTrapped, undo: undoRemoveNew, failure: "create new container"},
		step{name: StepStartNew, journal: store.StepOverlap, do: actStartOverlap, undo: undoRemoveNew, failure: "start new container"},
		step{name: StepHandover, do: actHandover, undo: undoRemoveNew, failure: "handover"})
	if !kube {
		if s.postStart {
			plan = append(plan, step{name: StepPostStart, do: actPostStart, undo: undoRemoveNew, failure: "postStart hook"})
		}
		plan = append(plan, step{name: StepHealthGate, do: actHealthGate, undo: undoRemoveNew, failure: "health gate"})
		plan = append(plan, beforeStop(s)...)
	}
	stop, commit := stopAndCommit(s.kind)
	stop.aborted = abortedBeforeStop
	return append(plan, stop, commit)
}

// overlapHead is an overlap's pull and config: a kubelet-driven one pulls
// before kubelet's StopContainer and waits for it, as a stop-first one does.
func overlapHead(s planSpec) []step {
	const pullFailed = "pull failed, old container untouched"
	if s.kind == KindKubelet {
		return []step{{name: StepPull, do: actPullKubelet, failure: pullFailed}, {do: actProceed},
			{journal: store.StepPrepared, do: actKubeletConfig}}
	}
	config := actConfig
	if s.specHash {
		config = actConfigSpec
	}
	return []step{{name: StepPull, journal: store.StepPrepared, do: actPull, failure: pullFailed}, {do: config}}
}

// stopAndCommit are the stop of the old container and the commit of an
// overlap swap of kind, and of its fallback.
func stopAndCommit(kind string) (stop, commit step) {
	if kind == KindKubelet {
		return step{name: StepStopOld, journal: store.StepStopOld, do: actStopOldKube, undo: undoStepAside, failure: "stop old container"},
			step{name: StepCommit, do: actCommitKubelet, undo: undoStepAside, optional: true}
	}
	return step{name: StepStopOld, journal: store.StepStopOld, do: actStopOld, undo: undoRollback, failure: "stop old container"},
		step{name: StepCommit, do: actCommit, undo: undoRollback, optional: true}
}

// beforeStop are the optional steps before an overlap's stop of the old
// container: the caller's drain and the preStop handler (not journaled:
// the journal stays at StepOverlap, from which recovery removes the new
// container).
func beforeStop(s planSpec) []step {
	var plan []step
	if s.drain {
		plan = append(plan, step{name: StepDrain, do: actDrain, undo: undoRemoveNew, optional: true})
	}
	if s.preStop && s.kind != KindKubelet {
		plan = append(plan, step{name: StepPreStop, do: actPreStop, undo: undoRemoveNew, optional: true})
	}
	return plan
}

// fallbackPlan is the rest of an overlap swap whose handover did not
// complete (a port the new container did not bind by the deadline, or a
// bind that cannot be handed over): stop-first with the connection hold
// from there. The new container runs already; a bind of it that waits
// for the old socket continues in the kernel once the old one is gone.
func fallbackPlan(s planSpec) []step {
	plan := beforeStop(s)
	connHold := step{do: actRecordNoHold, undo: undoRemoveNew, aborted: abortedBeforeStop}
	if s.hold {
		connHold.name, connHold.do, connHold.optional = StepConnectionHold, actHoldConnections, true
	}
	stop, commit := stopAndCommit(s.kind)
	plan = append(plan, connHold, stop)
	if s.kind != KindKubelet {
		plan = append(plan, step{name: StepHealthGate, journal: store.StepHealthGate, do: actHealthGate, undo: undoRollback,
			failure: "health gate", aborted: abortedAfterStop})
	}
	return append(plan, commit)
}

// rollbackPlan is the plan of undoRollback: one step, journaled, that
// removes the new container and creates the old configuration again as the
// next attempt.
func rollbackPlan() []step {
	return []step{{name: StepRollback, journal: store.StepRollingBack, do: actRollback}}
}

// planKinds are the kinds of swap with the spec each is planned from; the
// package doc's step list is rendered from them (TestDocStepOrder).
var planKinds = []struct {
	name string
	spec planSpec
}{
	{"node-local (inplacectl swap)", planSpec{kind: KindSwap, preStop: true, hold: true, postStart: true}},
	{"request on the pod (inplaced.io/swap)", planSpec{kind: KindSwap, drain: true, specHash: true, preStop: true, hold: true, postStart: true}},
	{"env from pod metadata", planSpec{kind: KindSwap, preStop: true, hold: true}},
	{"revert (inplacectl revert)", planSpec{kind: KindRevert, preStop: true, hold: true, postStart: true}},
	{"kubelet-driven (pod spec image)", planSpec{kind: KindKubelet, hold: true}},
	{"node-local, overlap (inplaced.io/swap-strategy: overlap)", planSpec{kind: KindSwap, preStop: true, hold: true, postStart: true, overlap: true}},
	{"request on the pod, overlap", planSpec{kind: KindSwap, drain: true, specHash: true, preStop: true, hold: true, postStart: true, overlap: true}},
	{"kubelet-driven, overlap", planSpec{kind: KindKubelet, hold: true, overlap: true}},
}

// names lists a plan's shown steps, in brackets those the minimal plan
// of its kind does not have.
func names(plan, minimal []step) string {
	always := map[string]bool{}
	for _, s := range minimal {
		always[s.name] = true
	}
	var out []string
	for _, s := range plan {
		switch {
		case s.name == "":
		case always[s.name]:
			out = append(out, s.name)
		default:
			out = append(out, "["+s.name+"]")
		}
	}
	return strings.Join(out, " → ")
}

// renderPlans writes the shown steps of every kind of swap, indented for
// the package doc, the steps a request may add or leave out in brackets.
func renderPlans() string {
	var b strings.Builder
	for _, k := range planKinds {
		minimal := k.spec
		minimal.drain, minimal.specHash, minimal.preStop, minimal.postStart, minimal.hold = false, false, false, false, false
		b.WriteString("\t" + k.name + ":\n\t\t" + names(planFor(k.spec), planFor(minimal)) + "\n")
	}
	b.WriteString("\toverlap, after a handover that did not complete:\n\t\t" + names(fallbackPlan(planSpec{kind: KindSwap, drain: true, preStop: true, hold: true}), fallbackPlan(planSpec{kind: KindSwap})) + "\n")
	b.WriteString("\tkubelet-driven overlap, after a handover that did not complete:\n\t\t" + names(fallbackPlan(planSpec{kind: KindKubelet, hold: true}), fallbackPlan(planSpec{kind: KindKubelet})) + "\n")
	b.WriteString("\tany failure after stop-old (not kubelet-driven):\n\t\t" + rollbackPlan()[0].name + "\n")
	return b.String()
}
