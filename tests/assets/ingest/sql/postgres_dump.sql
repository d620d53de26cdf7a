--
-- PostgreSQL database dump
--

-- Dumped from database version 15.6
SET statement_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);

CREATE FUNCTION public.touch() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
  NEW.updated := now(); -- a semicolon inside a dollar-quoted body
  RETURN NEW;
END;
$$;

CREATE TABLE public.qa (
    id integer NOT NULL,
    question text NOT NULL,
    answer text,
    "Tags" character varying(200),
    CONSTRAINT qa_answer_check CHECK ((length(answer) > 0))
);

ALTER TABLE public.qa OWNER TO app;

COPY public.qa (id, question, answer, "Tags") FROM stdin;
1	What is a tokenizer?	It maps text to integer ids.\nSubword tokenizers split rare words.	basics
2	Tabs?	A tab\there and a backslash \\ here.	\N
3	Null answer	\N	basics
4	Old question	It's the same; no doubled quote in COPY.	misc
\.

INSERT INTO public.qa VALUES (5, 'Inserted row', 'It''s standard SQL: '' doubles a quote, \n is literal.', NULL);

ALTER TABLE ONLY public.qa
    ADD CONSTRAINT qa_pkey PRIMARY KEY (id);

--
-- PostgreSQL database dump complete
--
