package main

import (
	"fmt"

	"github.com/spf13/cobra"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// newCheckCommand lists the pods on the node that no longer fit it: an
// in-place change bypasses the scheduler, so a node label or taint that
// changed since the pod was scheduled is found here.
func newCheckCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "List the pods on this node that no longer fit it (nodeSelector, required node affinity, taints), and why",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := g.client()
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.CheckPods(cmd.Context(), &inplacedv1.CheckPodsRequest{})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if g.output != "table" {
				return printStructured(w, g.output, resp)
			}
			if len(resp.Misfits) == 0 {
				fmt.Fprintf(w, "all %d pods fit node %s\n", resp.PodsChecked, resp.Node)
				return nil
			}
			fmt.Fprintf(w, "%-40s %s\n", "POD", "WHY IT NO LONGER FITS NODE "+resp.Node)
			for _, m := range resp.Misfits {
				fmt.Fprintf(w, "%-40s %s\n", m.Namespace+"/"+m.Pod, m.Reason)
			}
			return nil
		},
	}
}
