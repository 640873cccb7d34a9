package main

// Trace records: the same JSON fields, in the same order, as cacher-core's replay::Record.

import (
	"bytes"
	"encoding/json"
)

type record struct {
	At          uint64            `json:"at"`
	ID          *string           `json:"id,omitempty"`
	Type        string            `json:"type"`
	Source      *string           `json:"source,omitempty"`
	Key         *string           `json:"key,omitempty"`
	RV          *uint64           `json:"rv,omitempty"`
	Value       *string           `json:"value,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Cause       *string           `json:"cause,omitempty"`
	Code        *int32            `json:"code,omitempty"`
	Reason      *string           `json:"reason,omitempty"`
	Message     *string           `json:"message,omitempty"`
	RetryAfterS *int32            `json:"retry_after_s,omitempty"`
	Items       *[]item           `json:"items,omitempty"`
	Continue    *string           `json:"continue,omitempty"`
	Remaining   *int64            `json:"remaining,omitempty"`
}

type item struct {
	Key   string  `json:"key"`
	RV    uint64  `json:"rv"`
	Value *string `json:"value"` // null when absent, as serde writes Option::None
}

func ptr[T any](v T) *T { return &v }

// traceJSON is the golden-file format: an array with one record per line.
func traceJSON(trace []record) []byte {
	var out bytes.Buffer
	out.WriteString("[\n")
	for i, r := range trace {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(r)
		out.Write(bytes.TrimRight(b.Bytes(), "\n"))
		if i+1 < len(trace) {
			out.WriteString(",\n")
		} else {
			out.WriteString("\n")
		}
	}
	out.WriteString("]\n")
	return out.Bytes()
}
