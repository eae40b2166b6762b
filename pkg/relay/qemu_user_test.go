//go:build qemu_user

package relay

// underQEMU: the tests run under qemu-user (make test-arm64, -tags
// qemu_user), where every instruction is emulated and the machine's load
// stretches latencies tenfold and more: a bound on how long something
// takes says nothing there, only whether it ends.
const underQEMU = true
