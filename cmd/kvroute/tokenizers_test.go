package main

import (
	"strings"
	"testing"
)

func TestParseTokenizersReadsTheFlags(t *testing.T) {
	tests := []struct {
		name       string
		specs      []string
		templates  []string
		wantModels int
		wantErr    string
	}{
		{name: "model and folder", specs: []string{"m=/tok"}, wantModels: 1},
		{name: "two names share one folder", specs: []string{"a=/tok", "b=/tok"}, wantModels: 2},
		{name: "template override", specs: []string{"m=/tok"}, templates: []string{"m=/t.jinja"}, wantModels: 1},
		{name: "the same folder twice", specs: []string{"m=/tok", "m=/tok"}, wantModels: 1},
		{name: "two folders for one model", specs: []string{"m=/tok", "m=/other"}, wantErr: "given twice"},
		{name: "bare folder is tokenize's form", specs: []string{"/tok"}, wantErr: "MODEL=DIR"},
		{name: "empty model", specs: []string{"=/tok"}, wantErr: "MODEL=DIR"},
		{name: "template without a tokenizer", specs: []string{"m=/tok"}, templates: []string{"x=/t.jinja"}, wantErr: `"x"`},
		{name: "template without a file", specs: []string{"m=/tok"}, templates: []string{"m"}, wantErr: "MODEL=FILE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTokenizers(tt.specs, tt.templates)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.wantModels {
				t.Fatalf("%d models, want %d: %v", len(got), tt.wantModels, got)
			}
			if len(tt.templates) > 0 && got["m"].ChatTemplate != "/t.jinja" {
				t.Errorf("template not attached: %+v", got["m"])
			}
		})
	}
}
