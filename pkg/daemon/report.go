package daemon

import (
	"fmt"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/inplaced/inplaced/pkg/health"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/version"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Node event reasons of inplaced's own health.
const (
	EventDegraded        = "InplacedDegraded"
	EventRecovered       = "InplacedRecovered"
	EventJournalSetAside = "InplacedJournalEntrySetAside"
)

// reporter tells the operator about the board's changes and journal
// entries set aside: in the log, the metrics and, in Kubernetes mode, as
// events on the Node.
type reporter struct {
	obs  *observers
	kube *kubeSlot
	log  *zap.Logger
}

func (r *reporter) changed(p health.Problem, cleared bool) {
	if r.obs.metrics != nil {
		r.obs.metrics.SetDegraded(string(p.Part), !cleared)
	}
	if cleared {
		r.log.Info("back in service", zap.String("part", string(p.Part)))
		r.kube.NodeEvent(corev1.EventTypeNormal, EventRecovered, fmt.Sprintf("inplaced %s: back in service", p.Part))
		return
	}
	refused := ""
	if p.BlocksSwaps {
		refused = "; swaps and resizes are refused meanwhile"
	}
	r.log.Error("out of service: kubelet's CRI calls still pass through"+refused,
		zap.String("part", string(p.Part)), zap.String("problem", p.What), zap.String("action", p.Action))
	r.event(p)
}

// event writes a problem as a Node event (once Kubernetes mode runs).
func (r *reporter) event(p health.Problem) {
	if p.Part == health.PartKubeconfig || p.Part == health.PartCredentials { // no events before Kubernetes mode runs
		return
	}
	refused := ""
	if p.BlocksSwaps {
		refused = "; swaps and resizes are refused meanwhile"
	}
	r.kube.NodeEvent(corev1.EventTypeWarning, EventDegraded, fmt.Sprintf("inplaced %s: %s%s. %s", p.Part, p.What, refused, p.Action))
}

func (r *reporter) setAside(swapID string, err error) {
	if r.obs.metrics != nil {
		r.obs.metrics.SetAside()
	}
	r.log.Error("journal entry set aside: that swap is not recovered, the others are", zap.String("swap_id", swapID), zap.Error(err))
	r.kube.NodeEvent(corev1.EventTypeWarning, EventJournalSetAside, fmt.Sprintf("swap %s: %v", swapID, err))
}

// statusOf is the control API's Status.
func statusOf(board *health.Board, k *stateKeeper, kube *kubeSlot, st *store.Store) *inplacedv1.StatusResponse {
	resp := &inplacedv1.StatusResponse{Version: version.Version, SwapsAllowed: k.refusal() == nil,
		StateFile: st.Path(), Kubernetes: kube.mode()}
	for _, p := range board.Problems() {
		resp.Problems = append(resp.Problems, &inplacedv1.HealthProblem{Part: string(p.Part), What: p.What, Action: p.Action,
			SinceUnixNano: p.Since.UnixNano(), BlocksSwaps: p.BlocksSwaps})
	}
	// A write that failed a moment ago is on the board at the keeper's next
	// look; say it now.
	if p := st.Problem(); p != nil && !hasPart(resp.Problems, health.PartState) {
		resp.Problems = append(resp.Problems, &inplacedv1.HealthProblem{Part: string(health.PartState), What: p.Error(),
			Action: p.Action, SinceUnixNano: p.Since.UnixNano(), BlocksSwaps: true})
	}
	return resp
}

func hasPart(ps []*inplacedv1.HealthProblem, part health.Part) bool {
	for _, p := range ps {
		if p.Part == string(part) {
			return true
		}
	}
	return false
}
