package webui

import "net/http"

func (u *UI) registerBrowsePages(mux *http.ServeMux) {}
