// Package seccomp is containerd's default seccomp profile (RuntimeDefault),
// copied from containerd's contrib/seccomp so that inplaced builds the same
// rules without linking what that package also imports (containerd's oci,
// mount, snapshot and image packages, four more modules, about 0.5 MB of
// binary, for one function).
//
// default.go is containerd's seccomp_default.go as it is, with a generated
// header: TestDefaultIsContainerds compares it with the file in the
// containerd module that go.mod requires and fails when they differ, so a
// containerd upgrade cannot leave stale rules behind (run the test with
// -update to copy the new file).
package seccomp
