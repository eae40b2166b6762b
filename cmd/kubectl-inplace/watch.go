package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
)

// errPodGone ends a follow whose pod was deleted.
var errPodGone = errors.New("the pod was deleted")

// rewatchDelay is the pause before a watch that failed or closed is opened
// again.
var rewatchDelay = time.Second

// watchPod calls fn with the pod as it is now and then with every change
// until fn says done, fn fails, the pod goes or ctx ends. The watch is
// opened before the pod is read, so no change between the two is missed;
// fn sees some states twice and must not mind. A watch that closes (API
// server restart, timeout) is opened again.
func watchPod(ctx context.Context, client Client, ns, name string, fn func(*corev1.Pod) (bool, error)) error {
	pods := client.Pods(ns)
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	for {
		w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			if fatalAPIError(err) {
				return fmt.Errorf("watch pod %s: %w", name, err)
			}
		} else {
			done, err := watchOnce(ctx, w, func() (*corev1.Pod, error) { return pods.Get(ctx, name, metav1.GetOptions{}) }, name, fn)
			w.Stop()
			if done || err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(rewatchDelay):
		}
	}
}

// watchOnce reads the pod, then follows w until it closes (false, nil).
func watchOnce(ctx context.Context, w watch.Interface, get func() (*corev1.Pod, error), name string, fn func(*corev1.Pod) (bool, error)) (bool, error) {
	p, err := get()
	switch {
	case apierrors.IsNotFound(err):
		return true, errPodGone
	case err != nil && fatalAPIError(err):
		return true, fmt.Errorf("get pod %s: %w", name, err)
	case err == nil:
		if done, err := fn(p); done || err != nil {
			return true, err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return true, context.Cause(ctx)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false, nil
			}
			if open, done, err := watchEvent(ev, name, fn); !open || done || err != nil {
				return done, err
			}
		}
	}
}

// watchEvent hands one event of the pod to fn: open false when the watch
// must be opened again, done when the follow ends.
func watchEvent(ev watch.Event, name string, fn func(*corev1.Pod) (bool, error)) (open, done bool, err error) {
	switch ev.Type {
	case watch.Error:
		return false, false, nil
	case watch.Deleted:
		if p, ok := ev.Object.(*corev1.Pod); ok && p.Name == name {
			return true, true, errPodGone
		}
	case watch.Added, watch.Modified:
		p, ok := ev.Object.(*corev1.Pod)
		if !ok || p.Name != name {
			return true, false, nil
		}
		if end, ferr := fn(p); end || ferr != nil {
			return true, true, ferr
		}
	}
	return true, false, nil
}

// fatalAPIError: errors that a retry does not cure.
func fatalAPIError(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsInvalid(err) || apierrors.IsNotFound(err) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded)
}

// final: the swap ended (or was refused); nothing more will be written
// for this request.
func final(state string) bool {
	switch state {
	case podapi.StateCommitted, podapi.StateFailed, podapi.StateRolledBack, podapi.StateRollbackFailed,
		podapi.StateAborted, podapi.StateRefused:
		return true
	}
	return false
}

func condition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// podReady: the pod's Ready condition is True.
func podReady(p *corev1.Pod) bool {
	c := condition(p, corev1.PodReady)
	return c != nil && c.Status == corev1.ConditionTrue
}
