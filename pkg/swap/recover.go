package swap

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Recover converges every swap the journal says was unfinished when inplaced
// stopped. It relies on these facts:
//
//   - a journal step is on disk before the step begins, so the runtime is at
//     that step or the one before it;
//   - the new container has the journaled attempt number, so it can be found
//     even if inplaced died between CreateContainer and writing its ID;
//   - the old container is only ever stopped, never removed, by a swap.
//
// Roll forward when the new container exists and runs; otherwise remove it
// and make sure the old configuration runs (it still does if the swap never
// got to stop it; else recreate it as the next attempt).
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

func (e *Engine) recoverOne(ctx context.Context, j *store.JournalEntry) error {
	rec := &inplacedv1.SwapRecord{}
	oldReq := &runtimeapi.CreateContainerRequest{}
	if err := proto.Unmarshal(j.Record, rec); err != nil {
		return fmt.Errorf("decode record: %w", err)
	}
	if err := proto.Unmarshal(j.OldRequest, oldReq); err != nil {
		return fmt.Errorf("decode old config: %w", err)
	}
	var newReq *runtimeapi.CreateContainerRequest
	if len(j.NewRequest) > 0 {
		newReq = &runtimeapi.CreateContainerRequest{}
		if err := proto.Unmarshal(j.NewRequest, newReq); err != nil {
			return fmt.Errorf("decode new config: %w", err)
		}
	}
	log := e.log.With(zap.String("swap_id", j.SwapID), zap.String("sandbox_id", j.SandboxID),
		zap.String("container", j.ContainerName), zap.String("journal_step", string(j.Step)))
	e.recoverHold(j, rec, log)
	finish := func(state inplacedv1.SwapState, running, msg string) error {
		rec.State = state
		rec.RunningContainerId = running
		rec.FinishedUnixNano = e.now().UnixNano()
		if msg != "" {
			rec.Error = msg
		}
		rec.Steps = append(rec.Steps, &inplacedv1.Step{Name: "recover", StartedUnixNano: e.now().UnixNano(), Error: msg})
		if err := e.store.PutSwap(rec); err != nil {
			return err
		}
		log.Warn("recovered unfinished swap", zap.String("state", state.String()), zap.String("running_container_id", running), zap.String("detail", msg))
		return e.store.DeleteJournal(j.SwapID)
	}

	sb, err := e.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: j.SandboxID})
	sandboxGone := status.Code(err) == codes.NotFound || (err == nil && sb.GetStatus().GetState() != runtimeapi.PodSandboxState_SANDBOX_READY)
	if err != nil && !sandboxGone {
		return fmt.Errorf("sandbox status: %w", err)
	}
	resp, err := e.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: j.SandboxID}})
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	var same []*runtimeapi.Container
	var newC *runtimeapi.Container
	for _, c := range resp.Containers {
		if c.GetMetadata().GetName() != j.ContainerName && c.Labels[LabelContainerName] != j.ContainerName {
			continue
		}
		same = append(same, c)
		if c.Id == j.NewContainerID || (j.NewContainerID == "" && j.NewAttempt > 0 && c.GetMetadata().GetAttempt() == j.NewAttempt && c.Id != j.OldContainerID) {
			newC = c
		}
	}
	remove := func(id string) {
		_, _ = e.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 2})
		_, _ = e.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
		_ = e.store.DeleteContainer(id)
	}

	if sandboxGone {
		if newC != nil {
			remove(newC.Id)
		}
		return finish(inplacedv1.SwapState_SWAP_STATE_ABORTED, "", "the pod went away while inplaced was down")
	}
	if newC != nil && newC.State == runtimeapi.ContainerState_CONTAINER_RUNNING && j.Step != store.StepRollingBack {
		rec.NewContainerId = newC.Id
		if newReq != nil {
			_ = e.store.PutContainer(newC.Id, newReq)
			r := &run{e: e, rec: rec, oldReq: oldReq, newReq: newReq,
				t: &target{container: &runtimeapi.Container{Id: j.OldContainerID, PodSandboxId: j.SandboxID, Labels: oldReq.Config.GetLabels()}, name: j.ContainerName}}
			commit := r.commit
			if rec.Kind == KindRevert {
				commit = r.dropOverride
			}
			if err := commit(); err != nil {
				log.Error("write override after roll-forward", zap.Error(err))
			}
		}
		return finish(inplacedv1.SwapState_SWAP_STATE_COMMITTED, newC.Id, "")
	}
	if newC != nil {
		remove(newC.Id)
	}
	// The newest running container of the name (the old one if the swap
	// never stopped it, or a rollback container) is what runs.
	sort.Slice(same, func(a, b int) bool { return same[a].CreatedAt > same[b].CreatedAt })
	for _, c := range same {
		if newC != nil && c.Id == newC.Id {
			continue
		}
		if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			return finish(inplacedv1.SwapState_SWAP_STATE_FAILED, c.Id, "inplaced stopped during the swap; the old configuration still runs")
		}
	}
	// Nothing runs: recreate the old configuration after the highest attempt
	// in use, so the name is free.
	after := proto.Clone(oldReq.Config).(*runtimeapi.ContainerConfig)
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
	if newReq != nil {
		if a := newReq.Config.GetMetadata().GetAttempt(); a > after.GetMetadata().GetAttempt() {
			after = newReq.Config
		}
	}
	id, err := e.recreate(ctx, oldReq, after)
	if err != nil {
		return finish(inplacedv1.SwapState_SWAP_STATE_ROLLBACK_FAILED, "",
			fmt.Sprintf("inplaced stopped during the swap and the old configuration could not be recreated: %v — kubelet will recreate it from the pod spec", err))
	}
	return finish(inplacedv1.SwapState_SWAP_STATE_FAILED, id, "inplaced stopped during the swap; rolled back to the old configuration")
}
