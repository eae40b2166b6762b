package main

import (
	"time"

	"github.com/inplaced/inplaced/pkg/config"
)

// timeDuration lets a config.Duration be bound to a pflag duration flag.
type timeDuration config.Duration

func (d *timeDuration) ptr() *time.Duration { return (*time.Duration)(d) }
