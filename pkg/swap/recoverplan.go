package swap

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// The actions only a recovery plan takes; exec.go maps them to their code
// beside a swap's. A recovery also reuses a swap's commit and rollback
// actions: rolling forward is the swap's own commit, rolling back its own
// rollback.
const (
	actClearHold action = "remove the connection hold a crash left in the pod's network namespace"
	actRemoveNew action = "stop and remove the new container; another container of the name runs"
	actAdoptNew  action = "take the running new container as the swap's result"
	actRecordNew action = "record the new container's config, as its create would have"
)

// The messages a recovered swap ends with.
const (
	msgPodGone      = "the pod went away while inplaced was down"
	msgStillRuns    = "inplaced stopped during the swap; the old configuration still runs"
	msgRolledBack   = "inplaced stopped during the swap; rolled back to the old configuration"
	msgRecreateFail = "inplaced stopped during the swap and the old configuration could not be recreated: %v — kubelet will recreate it from the pod spec"
)

// journaled is a journal entry with its protobufs decoded: the swap as it
// stood when inplaced stopped.
type journaled struct {
	*store.JournalEntry
	rec    *inplacedv1.SwapRecord
	oldReq *runtimeapi.CreateContainerRequest
	// newReq is nil until the new config was journaled (with create-new).
	newReq *runtimeapi.CreateContainerRequest
}

// runtimeView is what the runtime reports about the swap's pod when
// recovery starts.
type runtimeView struct {
	// err: the runtime could not be asked; nothing can be decided.
	err         error
	sandboxGone bool // not found, or no longer ready
	// containers are the sandbox's, every name, as ListContainers returns
	// them.
	containers []*runtimeapi.Container
}

// recoveryEnd is how a recovered swap ends.
type recoveryEnd struct {
	state inplacedv1.SwapState
	// running is the container of the name that runs at the end ("" for
	// none), unless rolledBack.
	running string
	// rolledBack: the container the rollback step creates runs; its ID is
	// known only once the step is done.
	rolledBack bool
	msg        string
}

// recoveryPlan settles one unfinished swap: the steps to take, in order
// (none of them shown or journaled: the journal entry itself is what is
// being settled), and how the swap ends.
type recoveryPlan struct {
	steps []step
	// err: nothing is settled and the entry stays for the next attempt;
	// the steps before it are still taken.
	err error
	// newID is the swap's new container as the runtime lists it ("" when
	// it was never created or is gone): the one rolled forward to, or
	// removed.
	newID string
	// after is the config the rollback step creates the old configuration
	// after (as its next attempt): the newest attempt the name has used.
	after *runtimeapi.ContainerConfig
	// end is how the swap ends when the steps are done; failed when a step
	// that is not optional fails (only the rollback step can), its msg a
	// format for that step's error.
	end, failed recoveryEnd
}

// planRecovery decides how to settle an unfinished swap from its journal
// entry and what the runtime reports, without touching either. Forward
// when the new container runs (unless a rollback had begun: it decided
// against the new container; or the old one still runs: an overlap cut
// before its stop); otherwise the new container goes and the
// newest running container of the name is what runs, or, when none runs,
// the old configuration is created again.
func planRecovery(j *journaled, rt runtimeView) recoveryPlan {
	var p recoveryPlan
	// The hold goes first, whatever the runtime says: it parks the pod's
	// new connections until something releases it, and nothing will now.
	if j.Hold != nil {
		p.steps = append(p.steps, step{do: actClearHold})
	}
	if rt.err != nil {
		p.err = rt.err
		return p
	}
	same, newC := swapContainers(j.JournalEntry, rt.containers)
	if newC != nil {
		p.newID = newC.Id
	}
	switch {
	case rt.sandboxGone:
		p.removeNew()
		p.end = recoveryEnd{state: inplacedv1.SwapState_SWAP_STATE_ABORTED, msg: msgPodGone}
	case newC != nil && newC.State == runtimeapi.ContainerState_CONTAINER_RUNNING && j.Step != store.StepRollingBack &&
		!oldRunning(same, j.OldContainerID):
		p.rollForward(j)
	default:
		p.rollBack(j, same)
	}
	return p
}

// oldRunning reports whether the swap's old container still runs: an
// overlap swap (or its stop) was cut before the old container stopped, and
// the name must not be left with two running containers. The old one runs
// on; the new one goes.
func oldRunning(same []*runtimeapi.Container, oldID string) bool {
	for _, c := range same {
		if c.Id == oldID && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			return true
		}
	}
	return false
}

// swapContainers picks the swap's containers out of the sandbox's: those
// of its name, and among them the new one, by its journaled ID or, when
// inplaced died before writing it, by the attempt it was created as.
func swapContainers(j *store.JournalEntry, all []*runtimeapi.Container) (same []*runtimeapi.Container, newC *runtimeapi.Container) {
	for _, c := range all {
		if c.GetMetadata().GetName() != j.ContainerName && c.Labels[LabelContainerName] != j.ContainerName {
			continue
		}
		same = append(same, c)
		if c.Id == j.NewContainerID || (j.NewContainerID == "" && j.NewAttempt > 0 && c.GetMetadata().GetAttempt() == j.NewAttempt && c.Id != j.OldContainerID) {
			newC = c
		}
	}
	return same, newC
}

// removeNew removes the new container, when there is one.
func (p *recoveryPlan) removeNew() {
	if p.newID != "" {
		p.steps = append(p.steps, step{do: actRemoveNew})
	}
}

// rollForward commits the swap to its running new container, as the swap
// would have: a revert drops the override, any other kind writes it. A
// kubelet-driven swap has no commit of its own here: that commit depends on
// whether an override was in force when kubelet's stop came, which is not
// journaled. So it writes an override too; the override carries the old
// spec's hash, and kubelet's next create, with the new spec's, drops it.
// An entry without the new config can only name the new container: there
// is no config to record or commit.
func (p *recoveryPlan) rollForward(j *journaled) {
	p.steps = append(p.steps, step{do: actAdoptNew})
	if j.newReq != nil {
		commit := actCommit
		if j.rec.Kind == KindRevert {
			commit = actCommitRevert
		}
		// Bookkeeping only: the new container runs either way, and the
		// swap's own commit does not fail the swap over it either.
		p.steps = append(p.steps, step{do: actRecordNew, optional: true}, step{do: commit, optional: true})
	}
	p.end = recoveryEnd{state: inplacedv1.SwapState_SWAP_STATE_COMMITTED, running: p.newID}
}

// rollBack leaves the name with the old configuration running: the newest
// running container of the name other than the new one (the old one if the
// swap never stopped it, or the container of a rollback that got that far)
// runs on, else the rollback step creates the old configuration again
// after the newest attempt in use, so that the name is free.
func (p *recoveryPlan) rollBack(j *journaled, same []*runtimeapi.Container) {
	if c := newestRunning(same, p.newID); c != nil {
		p.removeNew()
		p.end = recoveryEnd{state: inplacedv1.SwapState_SWAP_STATE_FAILED, running: c.Id, msg: msgStillRuns}
		return
	}
	// The rollback step removes the new container itself.
	p.steps = append(p.steps, step{do: actRollback})
	p.after = newestAttempt(j, same)
	p.end = recoveryEnd{state: inplacedv1.SwapState_SWAP_STATE_FAILED, rolledBack: true, msg: msgRolledBack}
	p.failed = recoveryEnd{state: inplacedv1.SwapState_SWAP_STATE_ROLLBACK_FAILED, msg: msgRecreateFail}
}

// newestRunning is the most recently created running container of same,
// the new container (newID) aside.
func newestRunning(same []*runtimeapi.Container, newID string) *runtimeapi.Container {
	byAge := append([]*runtimeapi.Container(nil), same...)
	sort.Slice(byAge, func(a, b int) bool { return byAge[a].CreatedAt > byAge[b].CreatedAt })
	for _, c := range byAge {
		if c.Id != newID && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			return c
		}
	}
	return nil
}

// newestAttempt is the config whose next attempt the recreated container
// is: the old config at the highest attempt any container of the name
// has, or the new config when its attempt is higher still.
func newestAttempt(j *journaled, same []*runtimeapi.Container) *runtimeapi.ContainerConfig {
	after := proto.Clone(j.oldReq.Config).(*runtimeapi.ContainerConfig)
	if after.Metadata == nil {
		after.Metadata = &runtimeapi.ContainerMetadata{Name: j.ContainerName}
	}
	if after.Annotations == nil {
		after.Annotations = map[string]string{}
	}
	for _, c := range same {
		if a := c.GetMetadata().GetAttempt(); a > after.GetMetadata().GetAttempt() {
			after.Metadata.Attempt = a
			after.Annotations[AnnotationRestarts] = fmt.Sprint(a)
		}
	}
	if j.newReq != nil && j.newReq.Config.GetMetadata().GetAttempt() > after.GetMetadata().GetAttempt() {
		return j.newReq.Config
	}
	return after
}
