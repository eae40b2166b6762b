package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// parseResources reads Kubernetes quantities ("1500m", "512Mi").
func parseResources(cpu, cpuRequest, memory string) (*inplacedv1.Resources, error) {
	if cpu == "" && cpuRequest == "" && memory == "" {
		return nil, nil
	}
	r := &inplacedv1.Resources{}
	for _, q := range []struct {
		flag, val string
		set       func(resource.Quantity)
	}{
		{"--cpu", cpu, func(q resource.Quantity) { r.CpuLimitMillis = q.MilliValue() }},
		{"--cpu-request", cpuRequest, func(q resource.Quantity) { r.CpuRequestMillis = q.MilliValue() }},
		{"--memory", memory, func(q resource.Quantity) { r.MemoryLimitBytes = q.Value() }},
	} {
		if q.val == "" {
			continue
		}
		v, err := resource.ParseQuantity(q.val)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w (write e.g. 1500m, 2, 512Mi)", q.flag, q.val, err)
		}
		if v.Sign() <= 0 {
			return nil, fmt.Errorf("%s %q: must be positive", q.flag, q.val)
		}
		q.set(v)
	}
	return r, nil
}

func newResizeCommand(g *globals) *cobra.Command {
	var t targetFlags
	var cpu, cpuReq, mem string
	cmd := newCommand(g, "resize POD -n NAMESPACE -c CONTAINER [--cpu 1500m] [--cpu-request 500m] [--memory 512Mi]",
		"Change a running container's CPU and memory limits without a restart",
		cobra.MaximumNArgs(1), targetRequest(&t, func(target *inplacedv1.Target) (*inplacedv1.ResizeRequest, error) {
			res, err := parseResources(cpu, cpuReq, mem)
			if err != nil {
				return nil, err
			}
			if res == nil {
				return nil, fmt.Errorf("nothing to resize: give --cpu, --cpu-request or --memory")
			}
			return &inplacedv1.ResizeRequest{Target: target, Resources: res}, nil
		}), answer(inplacedv1.ControlClient.Resize, printResize))
	t.add(cmd)
	cmd.Flags().StringVar(&cpu, "cpu", "", "CPU limit (quota), e.g. 1500m")
	cmd.Flags().StringVar(&cpuReq, "cpu-request", "", "CPU request (cpu.shares / cpu.weight)")
	cmd.Flags().StringVar(&mem, "memory", "", "memory limit, e.g. 512Mi")
	return cmd
}

func printResize(w io.Writer, r *inplacedv1.ResizeRecord) {
	fmt.Fprintf(w, "resize %s of %s/%s/%s (%s): %s via %s in %s\n", r.Id, r.Namespace, r.Pod, r.Container, shortID(r.ContainerId),
		r.Result, r.Method, time.Duration(r.DurationNs).Round(time.Microsecond))
	if r.Caller != nil {
		fmt.Fprintf(w, "  caller: %s\n", r.Caller.Summary())
	}
	if r.RuntimeClass != "" {
		fmt.Fprintf(w, "  runtime handler %s (%s): enforced %s, by %s; verified: %s\n",
			handlerText(r.RuntimeHandler), r.RuntimeClass, r.Enforced, r.EnforcedBy, r.Verified)
	}
	if r.Requested != nil {
		fmt.Fprintf(w, "  requested for the container: %s\n", valuesText(r.Requested))
	}
	where := ""
	if r.Method == "sandbox" {
		where = " (whole sandbox)"
	}
	fmt.Fprintf(w, "  in effect%s: %s\n", where, valuesText(r.InEffect))
	if len(r.Repaired) > 0 {
		fmt.Fprintf(w, "  repaired by inplaced: %s\n", strings.Join(r.Repaired, ", "))
	}
	if r.Error != "" {
		fmt.Fprintf(w, "  error: %s\n", r.Error)
	}
}

func valuesText(v *inplacedv1.ResizeValues) string {
	return fmt.Sprintf("cpu quota %d/%d, shares %d, memory %d", v.GetCpuQuota(), v.GetCpuPeriod(), v.GetCpuShares(), v.GetMemoryLimitBytes())
}

func newResizesCommand(g *globals) *cobra.Command {
	return newListCommand(g, "resizes", "List resize history",
		inplacedv1.ControlClient.ListResizes, &inplacedv1.ListResizesRequest{},
		func(w io.Writer, resp *inplacedv1.ListResizesResponse) {
			for _, r := range resp.Resizes {
				printResize(w, r)
			}
		})
}

// printStructured prints m as JSON or YAML (the -o formats other than table).
func printStructured(w io.Writer, output string, m proto.Message) error {
	if output != "yaml" {
		return printJSON(w, m)
	}
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(b)
	if err != nil {
		return err
	}
	_, err = w.Write(y)
	return err
}

func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, string(b))
	return nil
}
