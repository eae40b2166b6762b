package store

// JournalStep names the last step of a swap that was *begun*: it is written
// before the step runs, so after a crash the step may or may not have
// happened, and recovery checks the runtime to find out.
type JournalStep string

// Journal steps, in order.
const (
	StepPrepared    JournalStep = "prepared"     // validated and pulled; nothing touched
	StepPreStop     JournalStep = "pre-stop"     // running the preStop hook
	StepStopOld     JournalStep = "stop-old"     // stopping the old container
	StepCreateNew   JournalStep = "create-new"   // creating the new container (NewAttempt set)
	StepStartNew    JournalStep = "start-new"    // starting it (NewContainerID set)
	StepHealthGate  JournalStep = "health-gate"  // waiting for it to prove healthy
	StepRollingBack JournalStep = "rolling-back" // undoing: recreating the old config
	// StepOverlap: starting the new container while the old one runs (an
	// overlap swap); recovery removes the new one, the old one runs on.
	StepOverlap JournalStep = "overlap"
)

// JournalEntry is what recovery needs to finish or undo a swap.
type JournalEntry struct {
	SwapID         string      `json:"swapID"`
	Step           JournalStep `json:"step"`
	SandboxID      string      `json:"sandboxID"`
	ContainerName  string      `json:"containerName"`
	OldContainerID string      `json:"oldContainerID"`
	NewContainerID string      `json:"newContainerID,omitempty"`
	NewAttempt     uint32      `json:"newAttempt"`
	// OldRequest and NewRequest are CreateContainerRequests (protobuf).
	OldRequest []byte `json:"oldRequest"`
	NewRequest []byte `json:"newRequest"`
	// Record is the SwapRecord so far (protobuf).
	Record []byte `json:"record"`
	// Kind is "swap" or "revert".
	Kind string `json:"kind"`
	// Hold is the connection hold of the swap, written before it is
	// installed: recovery deletes its table where the kernel did not.
	Hold *JournalHold `json:"hold,omitempty"`
}

// JournalHold is what recovery needs to remove a connection hold: the
// pod's network namespace (inplaced's tables there are named
// inplaced_hold_*) and, for the record, the ports and mode.
type JournalHold struct {
	NetNS string   `json:"netns"`
	Ports []uint16 `json:"ports"`
	Mode  string   `json:"mode"`
}

// Override is the sticky result of a committed swap: kubelet's later
// CreateContainer for the same container name in the same sandbox gets the
// swap's image, env, command and args, as long as kubelet's config carries
// the same hash as the container the swap replaced.
type Override struct {
	SandboxID string `json:"sandboxID"`
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	PodUID    string `json:"podUID"`
	Container string `json:"container"`
	SwapID    string `json:"swapID"`
	// Hash is io.kubernetes.container.hash of the replaced container.
	Hash string `json:"hash"`
	// Image is the swapped-in image reference.
	Image   string   `json:"image"`
	Env     []KV     `json:"env"`
	Command []string `json:"command"`
	Args    []string `json:"args"`
	// Declared is the CreateContainerRequest kubelet made before any swap
	// (protobuf): what revert goes back to.
	Declared []byte `json:"declared,omitempty"`
}

// KV is one environment variable.
type KV struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}
