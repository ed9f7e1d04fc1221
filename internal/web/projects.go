package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
)

// RegisterProjects mounts the admin API over forge repositories and their projects (frontends).
func (s *Server) RegisterProjects(en *project.Enabler) {
	h := &projectAPI{en: en}
	rt := s.routes
	rt.Handle("GET /api/repositories", access.Admin, s.wrap(s.requireAdmin(httpapi.WithDBTimeout(h.list))))
	rt.Handle("POST /api/projects/{repo_id}/enable", access.Admin, s.wrap(s.requireAdmin(h.enable)))
	rt.Handle("POST /api/projects/{repo_id}/disable", access.Admin, s.wrap(s.requireAdmin(h.disable)))
	rt.Handle("POST /api/projects/{repo_id}/settings", access.Admin, s.wrap(s.requireAdmin(httpapi.WithDBTimeout(h.settings))))
}

type projectAPI struct{ en *project.Enabler }

// projectRequest is the JSON body of enable and settings; every field is optional.
type projectRequest struct {
	Name         string           `json:"name"`
	Shares       *int             `json:"shares"`
	PREnabled    *bool            `json:"pr_enabled"`
	PRTrust      *string          `json:"pr_trust"`
	PollInterval *config.Duration `json:"poll_interval"` // "5m"; "0s" turns polling off
	// Private marks a project added by URL private (settings only): a forge's repository is
	// private as its forge says.
	Private *bool `json:"private"`
	// PromotePROutputs: see project.Project.PromotePROutputs.
	PromotePROutputs *bool `json:"promote_pr_outputs"`
}

func (p projectRequest) settings() project.Settings {
	s := project.Settings{Shares: p.Shares, PREnabled: p.PREnabled, PRTrust: p.PRTrust, PromotePROutputs: p.PromotePROutputs}
	if p.PollInterval != nil {
		s.PollInterval = &p.PollInterval.Duration
	}
	return s
}

func repoID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("repo_id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, httpapi.Errorf(http.StatusBadRequest, "invalid repository id %q: want a positive integer (GET /api/repositories lists them)", r.PathValue("repo_id"))
	}
	return id, nil
}

func decodeProjectRequest(r *http.Request) (projectRequest, error) {
	var p projectRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		return p, httpapi.Errorf(http.StatusBadRequest, "read body: %v", err)
	}
	if len(body) == 0 {
		return p, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, httpapi.Errorf(http.StatusBadRequest, "invalid JSON body: %v (fields: name, shares, pr_enabled, pr_trust, poll_interval, private, promote_pr_outputs)", err)
	}
	return p, nil
}

// projectRequestOf reads an enable or settings request: the repository id, the body and its
// settings, validated.
func projectRequestOf(r *http.Request) (int64, projectRequest, project.Settings, error) {
	id, err := repoID(r)
	if err != nil {
		return 0, projectRequest{}, project.Settings{}, err
	}
	req, err := decodeProjectRequest(r)
	if err != nil {
		return 0, projectRequest{}, project.Settings{}, err
	}
	s := req.settings()
	if err := s.Validate(); err != nil {
		return 0, projectRequest{}, project.Settings{}, httpapi.Errorf(http.StatusBadRequest, "%v", err)
	}
	return id, req, s, nil
}

// projectError maps the project package's errors to answers.
func projectError(err error) error {
	switch {
	case errors.Is(err, project.ErrNoRepository), errors.Is(err, project.ErrNotFound):
		return &httpapi.Error{Code: http.StatusNotFound, Msg: err.Error()}
	case errors.Is(err, project.ErrExists), errors.Is(err, project.ErrForgeNotConfigured), errors.Is(err, project.ErrPrivateFromForge):
		return &httpapi.Error{Code: http.StatusConflict, Msg: err.Error()}
	case errors.Is(err, forge.ErrNotFound):
		return &httpapi.Error{Code: http.StatusBadGateway, Msg: "the forge does not know the repository", Err: err}
	}
	var ae *forge.APIError
	if errors.As(err, &ae) {
		return &httpapi.Error{Code: http.StatusBadGateway, Msg: fmt.Sprintf("the forge refused: %d %s", ae.Code, ae.Message), Err: err}
	}
	return err
}

func (h *projectAPI) list(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	rs, err := project.ListRepositories(r.Context(), h.en.Pool, q.Get("forge"), q.Get("q"))
	if err != nil {
		return err
	}
	if rs == nil {
		rs = []project.Repository{}
	}
	for i := range rs {
		rs[i] = rs[i].Redacted()
	}
	httpapi.WriteJSON(w, http.StatusOK, rs)
	return nil
}

func (h *projectAPI) enable(w http.ResponseWriter, r *http.Request) error {
	id, req, s, err := projectRequestOf(r)
	if err != nil {
		return err
	}
	if req.Name != "" {
		if err := project.ValidateName(req.Name); err != nil {
			return httpapi.Errorf(http.StatusBadRequest, "%v", err)
		}
	}
	if req.Private != nil {
		return httpapi.Errorf(http.StatusBadRequest, "a forge's repository is private as its forge says; a project added by URL is marked private in its settings")
	}
	p, err := h.en.Enable(r.Context(), id, project.EnableParams{Name: req.Name, Settings: s})
	if err != nil {
		return projectError(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, p.Redacted())
	return nil
}

func (h *projectAPI) disable(w http.ResponseWriter, r *http.Request) error {
	id, err := repoID(r)
	if err != nil {
		return err
	}
	p, err := h.en.Disable(r.Context(), id)
	if err != nil {
		return projectError(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, p.Redacted())
	return nil
}

func (h *projectAPI) settings(w http.ResponseWriter, r *http.Request) error {
	id, req, s, err := projectRequestOf(r)
	if err != nil {
		return err
	}
	if req.Name != "" {
		return httpapi.Errorf(http.StatusBadRequest, "a project's name cannot be changed")
	}
	if req.Private != nil {
		if err := project.SetPrivate(r.Context(), h.en.Pool, id, *req.Private); err != nil {
			return projectError(err)
		}
	}
	p, err := project.Configure(r.Context(), h.en.Pool, id, s)
	if err != nil {
		return projectError(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, p.Redacted())
	return nil
}
