// Package kubeclient is inplaced's Kubernetes API client: core/v1 only.
//
// k8s.io/client-go/kubernetes, its scheme and k8s.io/client-go/informers
// register every API group's types at init and link every group's client,
// informer and lister: about half of inplaced's executable and resident
// memory, for a daemon that reads and writes four core/v1 resources. This
// client is client-go's own generic typed client (gentype, what the
// generated core/v1 clients are made of) over a rest client whose scheme
// holds only core/v1 and meta/v1, so the requests are those of
// kubernetes.Interface's CoreV1(): same paths, verbs, subresources, query
// parameters, content types (protobuf preferred) and rate limits.
//
// The interfaces name exactly the verbs inplaced uses, which are the verbs
// deploy/kubernetes/rbac.yaml grants:
//
//	pods         list, watch, patch (and patch of pods/status)
//	nodes        list, watch
//	secrets      get
//	events       create, patch (record.EventSink, which also has update)
//
// cmd/inplaced's dependency test keeps the other API groups out.
package kubeclient

import (
	"context"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
)

// Scheme holds core/v1 and the meta/v1 types every group version uses
// (options, Status, WatchEvent): all that inplaced decodes, and what
// record.EventBroadcaster.NewRecorder needs to refer to a pod.
var Scheme = runtime.NewScheme()

var (
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

func init() {
	// As k8s.io/client-go/kubernetes/scheme does, for core/v1 alone.
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	utilruntime.Must(corev1.AddToScheme(Scheme))
}

// Interface is what inplaced does with the API server.
type Interface interface {
	Pods(namespace string) PodInterface
	Nodes() NodeInterface
	Secrets(namespace string) SecretInterface
	// EventSink writes each event to its own namespace.
	EventSink() record.EventSink
}

// PodInterface: the pods on this node, watched and patched.
type PodInterface interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Pod, error)
}

// NodeInterface: this node's own object, watched.
type NodeInterface interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// SecretInterface: a pod's imagePullSecrets, read.
type SecretInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error)
}

// Client implements Interface.
type Client struct {
	rest rest.Interface
}

var _ Interface = (*Client)(nil)

// NewForConfig returns a client for the API server of c, set up as
// k8s.io/client-go/kubernetes.NewForConfig sets up its CoreV1 client.
func NewForConfig(c *rest.Config) (*Client, error) {
	config := *c
	if config.UserAgent == "" {
		config.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	httpClient, err := rest.HTTPClientFor(&config)
	if err != nil {
		return nil, err
	}
	return NewForConfigAndClient(&config, httpClient)
}

// NewForConfigAndClient is NewForConfig with the given HTTP client, which
// takes precedence over c's transport settings.
func NewForConfigAndClient(c *rest.Config, h *http.Client) (*Client, error) {
	config := *c
	gv := corev1.SchemeGroupVersion
	config.GroupVersion = &gv
	config.APIPath = "/api"
	config.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(Scheme, codecs).WithoutConversion()
	if config.UserAgent == "" {
		config.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientForConfigAndClient(&config, h)
	if err != nil {
		return nil, err
	}
	return &Client{rest: rc}, nil
}

// Pods returns the pods of namespace ("" for all).
func (c *Client) Pods(namespace string) PodInterface {
	return gentype.NewClientWithList[*corev1.Pod, *corev1.PodList]("pods", c.rest, parameterCodec, namespace,
		func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} },
		gentype.PrefersProtobuf[*corev1.Pod]())
}

// Nodes returns the nodes.
func (c *Client) Nodes() NodeInterface {
	return gentype.NewClientWithList[*corev1.Node, *corev1.NodeList]("nodes", c.rest, parameterCodec, "",
		func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} },
		gentype.PrefersProtobuf[*corev1.Node]())
}

// Secrets returns the secrets of namespace.
func (c *Client) Secrets(namespace string) SecretInterface {
	return gentype.NewClient[*corev1.Secret]("secrets", c.rest, parameterCodec, namespace,
		func() *corev1.Secret { return &corev1.Secret{} }, gentype.PrefersProtobuf[*corev1.Secret]())
}

// EventSink returns the sink for a record.EventBroadcaster.
func (c *Client) EventSink() record.EventSink {
	return &eventSink{rest: c.rest}
}

// eventSink is typedcorev1.EventSinkImpl over Events(""): each request
// goes to the event's namespace, with the same requests.
type eventSink struct {
	rest rest.Interface
}

func (s *eventSink) Create(event *corev1.Event) (*corev1.Event, error) {
	return s.do(s.rest.Post().
		NamespaceIfScoped(event.Namespace, event.Namespace != "").
		Resource("events").
		Body(event))
}

func (s *eventSink) Update(event *corev1.Event) (*corev1.Event, error) {
	return s.do(s.rest.Put().
		NamespaceIfScoped(event.Namespace, event.Namespace != "").
		Resource("events").
		Name(event.Name).
		Body(event))
}

func (s *eventSink) Patch(event *corev1.Event, data []byte) (*corev1.Event, error) {
	return s.do(s.rest.Patch(types.StrategicMergePatchType).
		NamespaceIfScoped(event.Namespace, event.Namespace != "").
		Resource("events").
		Name(event.Name).
		Body(data))
}

// do returns the API server's error as it is: tools/record tells a
// missing event (create it instead of patching) by its concrete type.
func (s *eventSink) do(req *rest.Request) (*corev1.Event, error) {
	result := &corev1.Event{}
	err := req.Do(context.Background()).Into(result)
	return result, err
}
