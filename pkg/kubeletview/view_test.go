package kubeletview

import (
	"testing"
	"time"
)

func TestPresentation(t *testing.T) {
	v := New()
	if v.Presenting() || v.WhenInspected("c1") != nil {
		t.Fatal("a new view presents nothing")
	}
	v.PresentHash("c1", "h-old")
	if h, ok := v.PresentedHash("c1"); !ok || h != "h-old" || !v.Presenting() {
		t.Fatalf("presented %q %v", h, ok)
	}
	inspected := v.WhenInspected("c1")
	select {
	case <-inspected:
		t.Fatal("inspected before any ContainerStatus")
	default:
	}
	v.Inspected("c1")
	v.Inspected("c1") // twice: closes once
	select {
	case <-inspected:
	default:
		t.Fatal("not inspected after Inspected")
	}
	v.EndPresent("c1")
	if _, ok := v.PresentedHash("c1"); ok || v.Presenting() {
		t.Fatal("still presenting after EndPresent")
	}
}

func TestRelists(t *testing.T) {
	v := New()
	before := time.Now()
	next := v.NextRelist()
	if _, ok := v.FirstRelistAfter(before); ok {
		t.Fatal("a relist before any was seen")
	}
	v.Relisted()
	select {
	case <-next:
	default:
		t.Fatal("NextRelist not closed by a relist")
	}
	if at, ok := v.FirstRelistAfter(before); !ok || at.Before(before) {
		t.Fatalf("first relist after %v: %v %v", before, at, ok)
	}
	for i := 0; i < 20; i++ {
		v.Relisted()
	}
	if n := len(v.relists); n != 16 {
		t.Fatalf("kept %d relists, want the last 16", n)
	}
}
