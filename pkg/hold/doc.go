// Package hold parks new TCP connections to a pod's ports for the window of
// a swap, so that a client dialling the pod IP while no process listens waits
// instead of being refused.
//
// For the window only, one nftables table (owner flag: the kernel deletes it
// when the netlink socket that made it closes, so a dead inplaced leaves no
// rule) has one rule per port in the pod's network namespace:
//
//	tcp dport P tcp flags & (syn|ack) == syn queue num N bypass
//
// SYNs sit in NFQUEUE N with no verdict; established connections are not
// touched. When a listening socket appears on P that was not there when the
// hold began (sock_diag, polled every millisecond), the port's rule goes, and
// one batch verdict accepts every parked SYN: the kernel hands the original
// SYNs to the new process, and the client's own handshake merely took longer.
// Nothing terminates TCP here, nothing is proxied, and nothing stays in the
// data path afterwards.
//
// The release order is forced by the kernel: deleting a chain unregisters its
// hook, and the kernel then drops every packet still queued in that netns. So
// rules go first, the verdicts follow, the table goes last.
//
// Modes: queue (above), drop (the same rule with a drop verdict, no userspace
// part: clients retransmit after about a second) and off. queue falls back to
// drop where the queue cannot be used (no NFQUEUE, or another program already
// uses nfnetlink_queue in that netns, whose packets our chain's removal would
// drop). The native nft queue expression is tried first; kernels built without
// CONFIG_NFT_QUEUE get the xtables NFQUEUE target through nft_compat, in an ip
// and an ip6 table.
package hold
