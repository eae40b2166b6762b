package main

import (
	"fmt"

	"github.com/spf13/cobra"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// targetFlags are the two ways to name a container: POD -n NS -c NAME, or --id.
type targetFlags struct {
	namespace, container, id string
}

func (t *targetFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&t.namespace, "namespace", "n", "default", "pod namespace")
	cmd.Flags().StringVarP(&t.container, "container", "c", "", "container name in the pod")
	cmd.Flags().StringVar(&t.id, "id", "", "container ID or unique ID prefix (instead of POD -c CONTAINER)")
}

// PodFilter narrows what ps and watch show to a namespace and a pod ("":
// any).
type PodFilter struct {
	Namespace, Pod string
}

func (f *PodFilter) addNamespace(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.Namespace, "namespace", "n", "", "only this namespace")
}

// targetRequest is the request of a command that names one container:
// build makes it for the container the arguments and flags name.
func targetRequest[Req any](t *targetFlags, build func(*inplacedv1.Target) (Req, error)) func(*cobra.Command, []string) (Req, error) {
	return func(_ *cobra.Command, args []string) (Req, error) {
		target, err := t.target(args)
		if err != nil {
			var none Req
			return none, err
		}
		return build(target)
	}
}

func (t *targetFlags) target(args []string) (*inplacedv1.Target, error) {
	switch {
	case t.id != "" && len(args) > 0:
		return nil, fmt.Errorf("give either POD -c CONTAINER or --id, not both")
	case t.id != "":
		return &inplacedv1.Target{ContainerId: t.id}, nil
	case len(args) == 1 && t.container != "":
		return &inplacedv1.Target{Namespace: t.namespace, Pod: args[0], Container: t.container}, nil
	case len(args) == 1:
		return nil, fmt.Errorf("pod %q: give the container with -c CONTAINER", args[0])
	default:
		return nil, fmt.Errorf("no target: give POD -n NAMESPACE -c CONTAINER or --id CONTAINER_ID")
	}
}
