package main

// Scenario objects as example.Pod (k8s.io/apiserver/pkg/apis/example, the type of the upstream
// whitebox tests). A scenario object is a key, a value, an RV, labels and fields; the pod carries
// the key, value and fields in annotations, so the cacher's KeyFunc and GetAttrsFunc give back
// exactly the scenario's key and attributes (a scenario object without metadata.namespace has
// none, as in the core), and the trace shows what the client received.

import (
	"encoding/json"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
)

const (
	annKey    = "kube-oracle.watchcache.dev/key"
	annValue  = "kube-oracle.watchcache.dev/value"
	annFields = "kube-oracle.watchcache.dev/fields"
	annEnd    = "k8s.io/initial-events-end"
)

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	if err := example.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := examplev1.AddToScheme(scheme); err != nil {
		panic(err)
	}
}

func (o scObject) pod() *example.Pod {
	p := &example.Pod{}
	p.ResourceVersion = strconv.FormatUint(o.RV, 10)
	p.Namespace = o.Fields["metadata.namespace"]
	p.Name = o.Fields["metadata.name"]
	if p.Name == "" {
		p.Name = o.Key[strings.LastIndexByte(o.Key, '/')+1:]
	}
	p.Spec.NodeName = o.Fields["spec.nodeName"]
	if len(o.Labels) > 0 {
		p.Labels = map[string]string{}
		for k, v := range o.Labels {
			p.Labels[k] = v
		}
	}
	p.Annotations = map[string]string{annKey: o.Key}
	if o.Value != nil {
		p.Annotations[annValue] = *o.Value
	}
	if len(o.Fields) > 0 {
		b, _ := json.Marshal(o.Fields)
		p.Annotations[annFields] = string(b)
	}
	return p
}

func objectKey(obj runtime.Object) (string, error) {
	a, err := meta.Accessor(obj)
	if err != nil {
		return "", err
	}
	return a.GetAnnotations()[annKey], nil
}

func objectAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	a, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil, err
	}
	f := fields.Set{}
	if raw := a.GetAnnotations()[annFields]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &f); err != nil {
			return nil, nil, err
		}
	}
	return labels.Set(a.GetLabels()), f, nil
}

func objectField(obj runtime.Object, field string) string {
	_, f, err := objectAttrs(obj)
	if err != nil {
		return ""
	}
	return f[field]
}

// describe is what a client sees of an object: its key, resourceVersion and value.
func describe(obj runtime.Object) (key string, rv uint64, value *string, ann map[string]string) {
	a, err := meta.Accessor(obj)
	if err != nil {
		return "", 0, nil, nil
	}
	rv, _ = strconv.ParseUint(a.GetResourceVersion(), 10, 64)
	anns := a.GetAnnotations()
	key = anns[annKey]
	if v, ok := anns[annValue]; ok {
		value = &v
	}
	for k, v := range anns {
		if !strings.HasPrefix(k, "kube-oracle.") {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[k] = v
		}
	}
	return key, rv, value, ann
}
