package inplacedv1

import "fmt"

// Summary says who asked for a swap or a resize: the description the
// daemon gave its caller ("kubelet (pod spec)"), else the control socket
// peer's uid, pid and executable. The CLI's tables and the Watch events
// both show it, so it is written once, next to the message.
func (c *Caller) Summary() string {
	if d := c.GetDescription(); d != "" {
		return d
	}
	s := fmt.Sprintf("uid=%d pid=%d", c.GetUid(), c.GetPid())
	if c.GetExe() != "" {
		s += " " + c.GetExe()
	}
	return s
}
