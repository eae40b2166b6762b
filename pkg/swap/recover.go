package swap

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Recover converges every swap the journal says was unfinished when inplaced
// stopped: for each entry it asks the runtime about the pod, decides what
// to do (planRecovery, which says how) and does it (run.settle). It relies
// on these facts:
//
//   - a journal step is on disk before the step begins, so the runtime is
//     anywhere from just before that step to just before the next journaled
//     one (drain, hold, post-start and commit are not journaled);
//   - the new container has the journaled attempt number, so it can be found
//     even if inplaced died between CreateContainer and writing its ID;
//   - the old container is only ever stopped, never removed, by a swap;
//   - a connection hold is journaled before it is installed;
//   - a rollback is journaled before it touches the new container: from
//     there the swap had given up on it, even if it still runs.
func (e *Engine) Recover(ctx context.Context) error {
	entries, err := e.store.Journal()
	if err != nil {
		return err
	}
	var errs []error
	for _, j := range entries {
		err := e.recoverOne(ctx, j)
		e.obs.Recovered(j.SwapID, err)
		if err != nil {
			errs = append(errs, fmt.Errorf("recover swap %s: %w", j.SwapID, err))
		}
	}
	return errors.Join(errs...)
}

// recoverOne decides how to settle one unfinished swap from its journal
// entry and what the runtime reports (planRecovery), then does it.
func (e *Engine) recoverOne(ctx context.Context, j *store.JournalEntry) error {
	d, err := decodeEntry(j)
	if err != nil {
		return err
	}
	p := planRecovery(d, e.observe(ctx, j.SandboxID))
	return e.recoveryRun(ctx, d, p).settle(p)
}

// decodeEntry decodes the protobufs of a journal entry.
func decodeEntry(j *store.JournalEntry) (*journaled, error) {
	d := &journaled{JournalEntry: j, rec: &inplacedv1.SwapRecord{}, oldReq: &runtimeapi.CreateContainerRequest{}}
	if err := proto.Unmarshal(j.Record, d.rec); err != nil {
		return nil, fmt.Errorf("decode record: %w", err)
	}
	if err := proto.Unmarshal(j.OldRequest, d.oldReq); err != nil {
		return nil, fmt.Errorf("decode old config: %w", err)
	}
	if len(j.NewRequest) > 0 {
		d.newReq = &runtimeapi.CreateContainerRequest{}
		if err := proto.Unmarshal(j.NewRequest, d.newReq); err != nil {
			return nil, fmt.Errorf("decode new config: %w", err)
		}
	}
	return d, nil
}

// observe asks the runtime about the swap's pod: whether its sandbox is
// still there and ready, and its containers.
func (e *Engine) observe(ctx context.Context, sandboxID string) runtimeView {
	sb, err := e.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID})
	gone := runtimeGone(err) || (err == nil && sb.GetStatus().GetState() != runtimeapi.PodSandboxState_SANDBOX_READY)
	if err != nil && !gone {
		return runtimeView{err: fmt.Errorf("sandbox status: %w", err)}
	}
	resp, err := e.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sandboxID}})
	if err != nil {
		return runtimeView{err: fmt.Errorf("list containers: %w", err)}
	}
	return runtimeView{sandboxGone: gone, containers: resp.Containers}
}

// recoveryRun is the run that carries a recovery plan out: the swap as
// journaled, on the recovery's context, with the new container the plan
// found.
func (e *Engine) recoveryRun(ctx context.Context, d *journaled, p recoveryPlan) *run {
	j := d.JournalEntry
	r := &run{e: e, ctx: ctx, j: j, rec: d.rec, oldReq: d.oldReq, newReq: d.newReq, newID: p.newID,
		log: e.log.With(zap.String("swap_id", j.SwapID), zap.String("sandbox_id", j.SandboxID),
			zap.String("container", j.ContainerName), zap.String("journal_step", string(j.Step))),
		t: &target{container: &runtimeapi.Container{Id: j.OldContainerID, PodSandboxId: j.SandboxID, Labels: d.oldReq.Config.GetLabels()},
			name: j.ContainerName}}
	if p.after != nil {
		// The rollback step creates the old configuration as the attempt
		// after the new config's; after a crash the newest attempt in use
		// may be another container's (the plan's after).
		r.newReq = &runtimeapi.CreateContainerRequest{PodSandboxId: j.SandboxID, Config: p.after}
	}
	return r
}

// settle carries a recovery plan out with the swap executor's steps and
// actions (run.run), then records how the swap ended and clears its
// journal entry.
func (r *run) settle(p recoveryPlan) error {
	for _, s := range p.steps {
		if err := r.run(s); err != nil && !s.optional {
			end := p.failed
			end.msg = fmt.Sprintf(end.msg, err)
			return r.recovered(end)
		}
	}
	if p.err != nil {
		return p.err
	}
	end := p.end
	if end.rolledBack {
		end.running = r.rollbackID
	}
	return r.recovered(end)
}

// recovered records the end of a recovered swap: history first, then the
// journal entry goes, so a crash in between leaves an entry that the next
// recovery settles again.
func (r *run) recovered(end recoveryEnd) error {
	rec := r.rec
	rec.State = end.state
	rec.RunningContainerId = end.running
	rec.FinishedUnixNano = r.e.now().UnixNano()
	if end.msg != "" {
		rec.Error = end.msg
	}
	rec.Steps = append(rec.Steps, &inplacedv1.Step{Name: "recover", StartedUnixNano: r.e.now().UnixNano(), Error: end.msg})
	if err := r.e.store.PutSwap(rec); err != nil {
		return err
	}
	r.log.Warn("recovered unfinished swap", zap.String("state", end.state.String()), zap.String("running_container_id", end.running), zap.String("detail", end.msg))
	return r.e.store.DeleteJournal(r.j.SwapID)
}

// The code of the recovery plan's own actions (recoverplan.go).

func (r *run) doClearHold() error {
	r.e.recoverHold(r.j, r.rec, r.log)
	return nil
}

func (r *run) doRemoveNew() error {
	r.removeContainer(r.ctx, r.newID)
	return nil
}

func (r *run) doAdoptNew() error {
	r.rec.NewContainerId = r.newID
	return nil
}

func (r *run) doRecordNew() error { return r.e.store.PutContainer(r.newID, r.newReq) }
