//go:build !qemu_user

package relay

// underQEMU: see qemu_user_test.go.
const underQEMU = false
