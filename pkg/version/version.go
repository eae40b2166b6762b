// Package version carries build information, set by the Makefile with -ldflags.
package version

import runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

var (
	// Version is the release version.
	Version = "v0.1.0-dev"
	// Commit is the git commit the binary was built from.
	Commit = "unknown"
)

// CRIAPIVersion is the CRI API version this build speaks.
const CRIAPIVersion = "v1"

// CRIAPIPackage names the Go package of the CRI API this build was compiled with.
var _ = runtimeapi.ImageService_ServiceDesc
