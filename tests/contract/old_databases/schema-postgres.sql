CREATE FUNCTION public.audit_log_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
    BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$;
CREATE TABLE public.adapter_usage_hourly (
    endpoint_id text NOT NULL,
    adapter text NOT NULL,
    hour timestamp with time zone NOT NULL,
    requests bigint DEFAULT 0 NOT NULL,
    prompt_tokens bigint DEFAULT 0 NOT NULL,
    completion_tokens bigint DEFAULT 0 NOT NULL
);
CREATE TABLE public.admin_keys (
    id bigint NOT NULL,
    key_hash bytea NOT NULL,
    created_at timestamp with time zone NOT NULL,
    revoked_at timestamp with time zone
);
ALTER TABLE public.admin_keys ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.admin_keys_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.audit_log (
    id bigint NOT NULL,
    at timestamp with time zone NOT NULL,
    project_id text,
    actor text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    detail jsonb NOT NULL
);
ALTER TABLE public.audit_log ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.audit_log_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.batch_file_chunks (
    file_id text NOT NULL,
    seq bigint NOT NULL,
    data bytea NOT NULL
);
CREATE TABLE public.batch_files (
    id text NOT NULL,
    endpoint_id text NOT NULL,
    project_id text NOT NULL,
    purpose text NOT NULL,
    filename text NOT NULL,
    bytes bigint NOT NULL,
    created_at timestamp with time zone NOT NULL,
    lines bigint DEFAULT 0 NOT NULL,
    batch_id text,
    holds text,
    seq bigint NOT NULL,
    CONSTRAINT batch_files_holds_check CHECK (((holds IS NULL) OR (holds = ANY (ARRAY['done'::text, 'failed'::text])))),
    CONSTRAINT batch_files_purpose_check CHECK ((purpose = ANY (ARRAY['batch'::text, 'batch_output'::text])))
);
ALTER TABLE public.batch_files ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.batch_files_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.batch_requests (
    batch_id text NOT NULL,
    idx bigint NOT NULL,
    custom_id text NOT NULL,
    body bytea NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    line text,
    CONSTRAINT batch_requests_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'done'::text, 'failed'::text])))
);
CREATE TABLE public.batches (
    id text NOT NULL,
    endpoint_id text NOT NULL,
    project_id text NOT NULL,
    url text NOT NULL,
    input_file_id text NOT NULL,
    status text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    metadata jsonb NOT NULL,
    times jsonb NOT NULL,
    output_file_id text,
    error_file_id text,
    errors jsonb NOT NULL,
    total bigint NOT NULL,
    completed bigint DEFAULT 0 NOT NULL,
    failed bigint DEFAULT 0 NOT NULL,
    output_bytes bigint DEFAULT 0 NOT NULL,
    error_bytes bigint DEFAULT 0 NOT NULL,
    requests bigint DEFAULT 0 NOT NULL,
    prompt_tokens bigint DEFAULT 0 NOT NULL,
    completion_tokens bigint DEFAULT 0 NOT NULL,
    cost double precision DEFAULT 0 NOT NULL,
    seq bigint NOT NULL,
    client text DEFAULT ''::text NOT NULL,
    capacity text DEFAULT 'wake'::text NOT NULL,
    CONSTRAINT batches_status_check CHECK ((status = ANY (ARRAY['validating'::text, 'in_progress'::text, 'finalizing'::text, 'completed'::text, 'failed'::text, 'expired'::text, 'cancelling'::text, 'cancelled'::text])))
);
ALTER TABLE public.batches ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.batches_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.changes (
    seq bigint NOT NULL,
    kind text NOT NULL,
    key text NOT NULL
);
ALTER TABLE public.changes ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.changes_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.endpoint_adapters (
    endpoint_id text NOT NULL,
    name text NOT NULL,
    source text NOT NULL,
    rank bigint NOT NULL,
    base_model text,
    created_at timestamp with time zone NOT NULL,
    seq bigint NOT NULL,
    CONSTRAINT endpoint_adapters_rank_check CHECK ((rank >= 1))
);
ALTER TABLE public.endpoint_adapters ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.endpoint_adapters_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.endpoint_client_tokens (
    endpoint_id text NOT NULL,
    name text NOT NULL,
    token_hash bytea NOT NULL,
    hint text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    weight double precision NOT NULL,
    requests_per_minute bigint,
    last_used_at timestamp with time zone,
    seq bigint NOT NULL,
    CONSTRAINT endpoint_client_tokens_requests_per_minute_check CHECK ((requests_per_minute >= 1)),
    CONSTRAINT endpoint_client_tokens_weight_check CHECK ((weight > (0)::double precision))
);
ALTER TABLE public.endpoint_client_tokens ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.endpoint_client_tokens_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.endpoint_tokens (
    id bigint NOT NULL,
    endpoint_id text NOT NULL,
    token_hash bytea NOT NULL,
    created_at timestamp with time zone NOT NULL,
    revoked_at timestamp with time zone
);
ALTER TABLE public.endpoint_tokens ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.endpoint_tokens_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.endpoints (
    id text NOT NULL,
    name text NOT NULL,
    model_name text NOT NULL,
    model_kind text NOT NULL,
    gpu_type text NOT NULL,
    gpu_count bigint NOT NULL,
    location_name text NOT NULL,
    min_replicas bigint NOT NULL,
    max_replicas bigint NOT NULL,
    retention_seconds bigint NOT NULL,
    hourly_price double precision NOT NULL,
    currency text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    deleting_at timestamp with time zone,
    generation bigint DEFAULT 1 NOT NULL,
    project_id text DEFAULT 'default'::text NOT NULL,
    seq bigint NOT NULL,
    engine_settings text DEFAULT '{}'::text NOT NULL,
    CONSTRAINT endpoints_check CHECK (((max_replicas >= 1) AND (max_replicas >= min_replicas))),
    CONSTRAINT endpoints_gpu_count_check CHECK ((gpu_count >= 1)),
    CONSTRAINT endpoints_hourly_price_check CHECK ((hourly_price >= (0)::double precision)),
    CONSTRAINT endpoints_min_replicas_check CHECK ((min_replicas >= 0)),
    CONSTRAINT endpoints_model_kind_check CHECK ((model_kind = ANY (ARRAY['chat'::text, 'image'::text, 'embedding'::text, 'rerank'::text]))),
    CONSTRAINT endpoints_retention_seconds_check CHECK ((retention_seconds >= 0))
);
ALTER TABLE public.endpoints ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.endpoints_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE UNLOGGED TABLE public.inferd_gateway_load (
    instance_id text NOT NULL,
    endpoint_id text NOT NULL,
    in_flight integer NOT NULL,
    held integer NOT NULL,
    last_request_at timestamp with time zone,
    reported_at timestamp with time zone DEFAULT now() NOT NULL
);
CREATE TABLE public.inferd_leader (
    id integer NOT NULL,
    term bigint NOT NULL,
    holder text,
    since timestamp with time zone,
    heartbeat_at timestamp with time zone,
    CONSTRAINT inferd_leader_id_check CHECK ((id = 1))
);
CREATE TABLE public.memberships (
    project_id text NOT NULL,
    user_id text NOT NULL,
    role text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    CONSTRAINT memberships_role_check CHECK ((role = ANY (ARRAY['admin'::text, 'developer'::text, 'viewer'::text])))
);
CREATE TABLE public.meta (
    key text NOT NULL,
    value text NOT NULL
);
CREATE TABLE public.model_profiles (
    model_name text NOT NULL,
    gpu_type text NOT NULL,
    gpu_count bigint NOT NULL,
    document jsonb NOT NULL,
    measured_at text NOT NULL,
    CONSTRAINT model_profiles_gpu_count_check CHECK ((gpu_count >= 1))
);
CREATE TABLE public.projects (
    id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    quota jsonb DEFAULT '{}'::jsonb NOT NULL,
    quota_limit jsonb DEFAULT '{}'::jsonb NOT NULL
);
CREATE TABLE public.rate_limit_buckets (
    endpoint_id text NOT NULL,
    client text NOT NULL,
    level double precision NOT NULL,
    at double precision NOT NULL
);
CREATE TABLE public.registered_models (
    name text NOT NULL,
    project_id text,
    document jsonb NOT NULL,
    created_at text NOT NULL,
    seq bigint NOT NULL
);
ALTER TABLE public.registered_models ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.registered_models_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.replicas (
    id text NOT NULL,
    endpoint_id text NOT NULL,
    generation bigint NOT NULL,
    gpu_type text NOT NULL,
    gpu_count bigint NOT NULL,
    secret_hash bytea NOT NULL,
    status text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    node text NOT NULL,
    placement jsonb NOT NULL,
    reason text,
    url text,
    seq bigint NOT NULL,
    unresponsive_since timestamp with time zone,
    CONSTRAINT replicas_gpu_count_check CHECK ((gpu_count >= 1))
);
ALTER TABLE public.replicas ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.replicas_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);
CREATE TABLE public.usage_hourly (
    endpoint_id text NOT NULL,
    project_id text NOT NULL,
    hour timestamp with time zone NOT NULL,
    gpu_type text NOT NULL,
    gpu_count bigint NOT NULL,
    replica_seconds double precision DEFAULT 0 NOT NULL,
    requests bigint DEFAULT 0 NOT NULL,
    prompt_tokens bigint DEFAULT 0 NOT NULL,
    completion_tokens bigint DEFAULT 0 NOT NULL,
    images bigint DEFAULT 0 NOT NULL,
    cost double precision DEFAULT 0 NOT NULL
);
CREATE TABLE public.user_keys (
    id text NOT NULL,
    user_id text NOT NULL,
    name text NOT NULL,
    key_hash bytea NOT NULL,
    hint text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    last_used_at timestamp with time zone,
    revoked_at timestamp with time zone,
    project_id text
);
CREATE TABLE public.users (
    id text NOT NULL,
    created_at timestamp with time zone NOT NULL
);
ALTER TABLE ONLY public.adapter_usage_hourly
    ADD CONSTRAINT adapter_usage_hourly_pkey PRIMARY KEY (endpoint_id, adapter, hour);
ALTER TABLE ONLY public.admin_keys
    ADD CONSTRAINT admin_keys_key_hash_key UNIQUE (key_hash);
ALTER TABLE ONLY public.admin_keys
    ADD CONSTRAINT admin_keys_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.audit_log
    ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.batch_file_chunks
    ADD CONSTRAINT batch_file_chunks_pkey PRIMARY KEY (file_id, seq);
ALTER TABLE ONLY public.batch_files
    ADD CONSTRAINT batch_files_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.batch_requests
    ADD CONSTRAINT batch_requests_pkey PRIMARY KEY (batch_id, idx);
ALTER TABLE ONLY public.batches
    ADD CONSTRAINT batches_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.changes
    ADD CONSTRAINT changes_pkey PRIMARY KEY (seq);
ALTER TABLE ONLY public.endpoint_adapters
    ADD CONSTRAINT endpoint_adapters_pkey PRIMARY KEY (endpoint_id, name);
ALTER TABLE ONLY public.endpoint_client_tokens
    ADD CONSTRAINT endpoint_client_tokens_pkey PRIMARY KEY (endpoint_id, name);
ALTER TABLE ONLY public.endpoint_client_tokens
    ADD CONSTRAINT endpoint_client_tokens_token_hash_key UNIQUE (token_hash);
ALTER TABLE ONLY public.endpoint_tokens
    ADD CONSTRAINT endpoint_tokens_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.endpoint_tokens
    ADD CONSTRAINT endpoint_tokens_token_hash_key UNIQUE (token_hash);
ALTER TABLE ONLY public.endpoints
    ADD CONSTRAINT endpoints_name_key UNIQUE (project_id, name);
ALTER TABLE ONLY public.endpoints
    ADD CONSTRAINT endpoints_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.inferd_gateway_load
    ADD CONSTRAINT inferd_gateway_load_pkey PRIMARY KEY (instance_id, endpoint_id);
ALTER TABLE ONLY public.inferd_leader
    ADD CONSTRAINT inferd_leader_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.memberships
    ADD CONSTRAINT memberships_pkey PRIMARY KEY (project_id, user_id);
ALTER TABLE ONLY public.meta
    ADD CONSTRAINT meta_pkey PRIMARY KEY (key);
ALTER TABLE ONLY public.model_profiles
    ADD CONSTRAINT model_profiles_pkey PRIMARY KEY (model_name, gpu_type, gpu_count);
ALTER TABLE ONLY public.projects
    ADD CONSTRAINT projects_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.rate_limit_buckets
    ADD CONSTRAINT rate_limit_buckets_pkey PRIMARY KEY (endpoint_id, client);
ALTER TABLE ONLY public.registered_models
    ADD CONSTRAINT registered_models_pkey PRIMARY KEY (name);
ALTER TABLE ONLY public.replicas
    ADD CONSTRAINT replicas_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);
ALTER TABLE ONLY public.usage_hourly
    ADD CONSTRAINT usage_hourly_pkey PRIMARY KEY (endpoint_id, hour, gpu_type, gpu_count);
ALTER TABLE ONLY public.user_keys
    ADD CONSTRAINT user_keys_key_hash_key UNIQUE (key_hash);
ALTER TABLE ONLY public.user_keys
    ADD CONSTRAINT user_keys_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.users
    ADD CONSTRAINT users_pkey PRIMARY KEY (id);
CREATE INDEX audit_log_by_project ON public.audit_log USING btree (project_id, at);
CREATE INDEX audit_log_by_project_id ON public.audit_log USING btree (project_id, id);
CREATE INDEX batch_files_endpoint ON public.batch_files USING btree (endpoint_id);
CREATE INDEX batch_files_project ON public.batch_files USING btree (project_id);
CREATE INDEX batches_endpoint ON public.batches USING btree (endpoint_id);
CREATE INDEX batches_status ON public.batches USING btree (status);
CREATE UNIQUE INDEX endpoint_tokens_one_active ON public.endpoint_tokens USING btree (endpoint_id) WHERE (revoked_at IS NULL);
CREATE INDEX endpoints_by_seq ON public.endpoints USING btree (seq);
CREATE INDEX memberships_by_user ON public.memberships USING btree (user_id);
CREATE INDEX replicas_by_endpoint ON public.replicas USING btree (endpoint_id);
CREATE INDEX usage_hourly_by_project ON public.usage_hourly USING btree (project_id, hour);
CREATE INDEX user_keys_by_user ON public.user_keys USING btree (user_id);
CREATE TRIGGER audit_log_append_only BEFORE DELETE OR UPDATE ON public.audit_log FOR EACH ROW EXECUTE FUNCTION public.audit_log_append_only();
ALTER TABLE ONLY public.batch_file_chunks
    ADD CONSTRAINT batch_file_chunks_file_id_fkey FOREIGN KEY (file_id) REFERENCES public.batch_files(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.batch_files
    ADD CONSTRAINT batch_files_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES public.endpoints(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.batch_requests
    ADD CONSTRAINT batch_requests_batch_id_fkey FOREIGN KEY (batch_id) REFERENCES public.batches(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.batches
    ADD CONSTRAINT batches_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES public.endpoints(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.endpoint_adapters
    ADD CONSTRAINT endpoint_adapters_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES public.endpoints(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.endpoint_client_tokens
    ADD CONSTRAINT endpoint_client_tokens_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES public.endpoints(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.endpoint_tokens
    ADD CONSTRAINT endpoint_tokens_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES public.endpoints(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.memberships
    ADD CONSTRAINT memberships_project_id_fkey FOREIGN KEY (project_id) REFERENCES public.projects(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.memberships
    ADD CONSTRAINT memberships_user_id_fkey FOREIGN KEY (user_id) REFERENCES public.users(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.replicas
    ADD CONSTRAINT replicas_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES public.endpoints(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.user_keys
    ADD CONSTRAINT user_keys_user_id_fkey FOREIGN KEY (user_id) REFERENCES public.users(id) ON DELETE CASCADE;
version (1, 'endpoints, tokens, admin keys, replicas, change log, meta')
version (2, 'registered models, measured profiles')
version (3, 'accounts: projects, users, members, keys, audit log, usage; names unique per project')
version (4, "a project's quota limit, set by the operator; its own quota is set by its admins")
version (5, 'lists read a page at a time in the order of their identity columns')
version (6, "the coordination of instances: the leader row and the gateways' load")
version (7, 'a management key may be limited to one project (NULL: every project of its user)')
version (8, 'endpoints of embedding and rerank models')
version (9, "an endpoint's engine settings")
version (10, 'LoRA adapters registered on endpoints')
version (11, 'what each LoRA adapter served, per hour')
version (12, "the Batch API: files, batches and each request's result")
version (13, "named client tokens of endpoints, beside the owner's token")
version (14, 'the client token that created each batch')
version (15, "a replica's unresponsive mark, for every instance's routing")
version (16, "client tokens' rate-limit buckets, shared by every instance")
version (17, "what each batch may do to its endpoint's replicas")
