package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"
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
	cmd := &cobra.Command{
		Use:   "resize POD -n NAMESPACE -c CONTAINER [--cpu 1500m] [--cpu-request 500m] [--memory 512Mi]",
		Short: "Change a running container's CPU and memory limits without a restart",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			target, err := t.target(args)
			if err != nil {
				return err
			}
			res, err := parseResources(cpu, cpuReq, mem)
			if err != nil {
				return err
			}
			if res == nil {
				return fmt.Errorf("nothing to resize: give --cpu, --cpu-request or --memory")
			}
			return g.call(func(c inplacedv1.ControlClient) error {
				rec, err := c.Resize(cmd.Context(), &inplacedv1.ResizeRequest{Target: target, Resources: res})
				if err != nil {
					// A refused or failed resize carries its record: show what
					// is in effect, then fail with the daemon's status.
					if rec := resizeRecordOf(err); rec != nil {
						_ = showResize(cmd.OutOrStdout(), g.output, rec)
					}
					return err
				}
				return showResize(cmd.OutOrStdout(), g.output, rec)
			})
		},
	}
	t.add(cmd)
	cmd.Flags().StringVar(&cpu, "cpu", "", "CPU limit (quota), e.g. 1500m")
	cmd.Flags().StringVar(&cpuReq, "cpu-request", "", "CPU request (cpu.shares / cpu.weight)")
	cmd.Flags().StringVar(&mem, "memory", "", "memory limit, e.g. 512Mi")
	return cmd
}

// resizeRecordOf returns the ResizeRecord the daemon attached to an error.
func resizeRecordOf(err error) *inplacedv1.ResizeRecord {
	for _, d := range status.Convert(err).Details() {
		if rec, ok := d.(*inplacedv1.ResizeRecord); ok {
			return rec
		}
	}
	return nil
}

// showResize prints a resize record in the -o format.
func showResize(w io.Writer, output string, r *inplacedv1.ResizeRecord) error {
	if output != "table" {
		return printStructured(w, output, r)
	}
	printResize(w, r)
	return nil
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
