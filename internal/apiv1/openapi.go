package apiv1

import (
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

// route is one GET route of the API: what registers it and what the OpenAPI document says
// of it, from one table so that the two cannot disagree.
type route struct {
	path     string // under Prefix, with {…} path values
	scope    access.Scope
	handler  httpapi.HandlerFunc
	summary  string
	params   []param
	response any // a value of the response's type
}

// param is a parameter of a route.
type param struct {
	name, in, typ, doc string
}

// Parameters several routes share.
var (
	pProject   = param{"project", "path", "string", "the project's name"}
	pEvalID    = param{"id", "path", "integer", "the evaluation's id"}
	pBuildID   = param{"id", "path", "integer", "the build's id"}
	pLimit     = param{"limit", "query", "integer", "rows per page, 1 to 200 (default 50)"}
	pAfterID   = param{"after", "query", "integer", "the previous page's `next`: the id of its last row"}
	pAfterAttr = param{"after", "query", "string", "the previous page's `next`: the name of its last attribute"}
)

// routes is the API, in the order of its README section.
func (a *API) routes() []route {
	return []route{
		{"projects", access.Filtered, a.projects,
			"The projects the caller may read, by name.", nil, ProjectList{}},
		{"projects/{project}", access.Project("project"), a.project,
			"A project with the latest evaluation of each branch and pull request.", []param{pProject}, ProjectDetail{}},
		{"projects/{project}/evaluations", access.Project("project"), a.projectEvaluations,
			"A project's evaluations, newest first, paged by id.", []param{pProject, pAfterID, pLimit}, EvaluationList{}},
		{"evaluations/{id}", access.Eval("id"), a.evaluation,
			"An evaluation, its builds by status and its attributes by name, paged by name.",
			[]param{pEvalID, pAfterAttr, pLimit}, EvaluationDetail{}},
		{"evaluations/{id}/failures", access.Eval("id"), a.failures,
			"An evaluation's failed attributes by name, each with the end of its failed build's log.",
			[]param{pEvalID, pAfterAttr, pLimit}, FailureList{}},
		{"evaluations/{id}/diff", access.Eval("id"), a.diff,
			"What changed against the previous finished evaluation of its branch (a pull request's: its base's latest).",
			[]param{pEvalID}, EvaluationDiff{}},
		{"builds/{id}", access.Job("id"), a.build,
			"A build: status, attempts, timings, builder, error and log.", []param{pBuildID}, Build{}},
		{"nodes", access.Free, a.nodes,
			"The cluster's nodes; anonymous callers get no endpoints, hostnames or versions.", nil, NodeList{}},
		{"queue", access.Filtered, a.queue,
			"The unfinished builds counted, and listed oldest first, paged by id.", []param{pAfterID, pLimit}, Queue{}},
		{"openapi.json", access.Free, a.openAPI,
			"This document.", nil, map[string]any{}},
	}
}

// openAPI is GET /api/v1/openapi.json.
func (a *API) openAPI(w http.ResponseWriter, r *http.Request) error {
	httpapi.WriteJSON(w, http.StatusOK, a.Document())
	return nil
}

// Document is the OpenAPI 3 document of the routes.
func (a *API) Document() map[string]any {
	paths := map[string]any{}
	for _, rt := range a.routes() {
		params := []any{}
		for _, p := range rt.params {
			params = append(params, map[string]any{"name": p.name, "in": p.in, "required": p.in == "path",
				"description": p.doc, "schema": map[string]any{"type": p.typ}})
		}
		responses := map[string]any{
			"200": map[string]any{"description": "OK",
				"content": map[string]any{"application/json": map[string]any{"schema": schemaOf(reflect.TypeOf(rt.response))}}},
			"default": map[string]any{"description": "An error: 400 for a bad parameter (named in the message), 404 for " +
				"what does not exist or the caller may not read, 503 when the database is unavailable.",
				"content": map[string]any{"application/json": map[string]any{"schema": errorSchema}}},
		}
		paths[Prefix+rt.path] = map[string]any{"get": map[string]any{
			"summary": rt.summary, "parameters": params, "responses": responses}}
	}
	return map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{"title": "harmonia-ci API", "version": "1",
			"description": "The read API. Times are RFC 3339 in UTC; ids are numbers. A private project's objects " +
				"are 404 to callers who may not read them, and left out of lists."},
		"paths": paths,
	}
}

var errorSchema = map[string]any{"type": "object", "properties": map[string]any{"error": map[string]any{"type": "string"}}}

var timeType = reflect.TypeOf(time.Time{})

// schemaOf is the JSON schema of t as encoding/json writes it.
func schemaOf(t reflect.Type) map[string]any {
	if t.Kind() == reflect.Pointer {
		s := schemaOf(t.Elem())
		s["nullable"] = true
		return s
	}
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t.Kind() == reflect.String:
		return map[string]any{"type": "string"}
	case t.Kind() == reflect.Bool:
		return map[string]any{"type": "boolean"}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return map[string]any{"type": "integer"}
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return map[string]any{"type": "number"}
	case t.Kind() == reflect.Slice:
		return map[string]any{"type": "array", "items": schemaOf(t.Elem())}
	case t.Kind() == reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem())}
	case t.Kind() == reflect.Interface:
		return map[string]any{}
	case t.Kind() == reflect.Struct:
		props := map[string]any{}
		addFields(t, props)
		return map[string]any{"type": "object", "properties": props}
	}
	return map[string]any{}
}

// addFields adds the JSON fields of struct t to props, those of embedded structs inline.
func addFields(t reflect.Type, props map[string]any) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			addFields(f.Type, props)
			continue
		}
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		props[name] = schemaOf(f.Type)
	}
}
