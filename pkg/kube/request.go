package kube

import (
	"time"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// CallerAnnotation describes who asked for an annotation-driven swap.
const CallerAnnotation = "pod annotation " + podapi.AnnotationSwap

// changeOf is the request as the swap engine's change and options.
func changeOf(r *podapi.SwapRequest) (*inplacedv1.Change, *inplacedv1.SwapOptions) {
	c := &inplacedv1.Change{SetEnv: r.Env, UnsetEnv: r.UnsetEnv}
	if r.Image != "" {
		img := r.Image
		c.Image = &img
	}
	if r.SetsCommand() {
		c.Command, c.SetCommand = r.Command, true
	}
	if r.SetsArgs() {
		c.Args, c.SetArgs = r.Args, true
	}
	o := &inplacedv1.SwapOptions{}
	if r.MinRuntime != "" {
		d, _ := time.ParseDuration(r.MinRuntime)
		o.MinRuntimeMs = d.Milliseconds()
	}
	switch {
	case r.HealthHTTP != "":
		port, path := r.HealthHTTPGet()
		o.HealthCheck = &inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Port: port, Path: path}}
	case r.HealthTCP != 0:
		o.HealthCheck = &inplacedv1.Handler{TcpPort: int64(r.HealthTCP)}
	case len(r.HealthExec) > 0:
		o.HealthCheck = &inplacedv1.Handler{Exec: r.HealthExec}
	}
	return c, o
}
