package e2e

import "fmt"

func sprintf(format string, a ...any) string { return fmt.Sprintf(format, a...) }
