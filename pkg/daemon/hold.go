package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/inplaced/inplaced/pkg/hold"
	"github.com/inplaced/inplaced/pkg/holdmode"
	"github.com/inplaced/inplaced/pkg/swap"
)

// HoldOneBatchEnv, set to 1, makes every hold release its parked SYNs in
// one batch instead of pacing them to the new listener's accept queue: the
// release before pacing, for make bench's comparison only.
const HoldOneBatchEnv = "INPLACED_TEST_HOLD_ONE_BATCH"

// holder is package hold behind the engine's Holder interface, so that the
// engine stays free of netlink and testable with a fake.
type holder struct{ oneBatch bool }

func (holder) Ports(netns string, pid int, declared []uint16) (swap.HoldPorts, error) {
	if netns == "" || pid == 0 {
		return swap.HoldPorts{}, errors.New("the backend's verbose status gives no pid or network namespace")
	}
	pids, err := hold.ContainerPids(pid)
	if err != nil {
		return swap.HoldPorts{}, err
	}
	p, err := hold.Discover(netns, pids, declared)
	return swap.HoldPorts{Hold: p.Hold, Listened: p.Observed}, err
}

func (hd holder) Hold(ctx context.Context, netns string, ports []uint16, mode holdmode.Mode) (swap.ActiveHold, error) {
	var opts []hold.Option
	if hd.oneBatch {
		opts = append(opts, hold.OneBatch())
	}
	h, err := hold.Hold(ctx, netns, ports, mode, opts...)
	if err != nil {
		return nil, err
	}
	return activeHold{h}, nil
}

func (holder) Remove(netns string) ([]string, error) { return hold.Remove(netns) }

type activeHold struct{ h *hold.Held }

func (a activeHold) Mode() holdmode.Mode { return a.h.Mode() }
func (a activeHold) Why() string         { return a.h.Why() }
func (a activeHold) Quiesce(ctx context.Context, max time.Duration) time.Duration {
	return a.h.Quiesce(ctx, max)
}

func (a activeHold) Start() time.Time { return a.h.Start() }

func (a activeHold) Listen(ctx context.Context, until time.Time) []uint16 {
	return a.h.Listen(ctx, until)
}

func (a activeHold) End(reason string) swap.HoldResult {
	r := a.h.End(reason)
	out := swap.HoldResult{Duration: r.Duration, Err: r.Err, Reason: reason}
	for _, p := range r.Ports {
		out.Ports = append(out.Ports, swap.HoldPortResult{Port: p.Port, Parked: int64(p.Parked), LongestWait: p.LongestWait,
			Reason: p.Reason, Batches: p.Batches, MaxBatch: p.MaxBatch, Backlog: p.Backlog})
		out.LongestWait = max(out.LongestWait, p.LongestWait)
	}
	return out
}
