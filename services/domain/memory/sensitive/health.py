"""`health`: conditions, diagnoses, medications, treatments, devices and disabilities, in English
and Spanish."""

from __future__ import annotations

import re

_HEALTH = re.compile(
    r"\b(?:"
    # diagnoses and the words around them
    r"diagnos\w*|prognosis|suffers? from|suffering from|padece\w*|padecimiento|sufre de|"
    r"enfermedad\w*|disease|illness|disorder|trastorno\w*|syndrome|sindrome|"
    r"medical (?:condition|history|record|issue|problem|leave)|health (?:condition|issue|problem)s?|"
    r"condicion medica|historial (?:medico|clinico)|problemas? de salud|salud mental|mental health|"
    r"baja medica|sick leave|chronic|cronic[oa]|terminal(?:ly)? ill|"
    # conditions
    r"cancer|tumou?rs?|tumor\w*|leukemia|leucemia|chemo\w*|quimio\w*|radiotherapy|radioterapia|"
    r"diabet\w*|asthma\w*|asma|asmatic[oa]|hiv|vih|sida|hepatitis|tuberculosis|"
    r"depress\w*|depresi\w*|deprimid[oa]|anxiety|panic attacks?|ataques? de panico|ansiedad|"
    r"bipolar|schizophreni\w*|esquizofreni\w*|psychosis|psicosis|adhd|tdah|autis\w*|asperger|"
    r"epilep\w*|seizures?|convulsion\w*|hypertension|hipertension|high blood pressure|tension alta|"
    r"heart (?:disease|attack|condition|failure)|infarto|cardiopatia|arrhythmia|arritmia|"
    r"(?:had|suffered) a stroke|ictus|"
    r"migraines?|migranas?|allerg\w*|alergi\w*|alergic[oa]|celiac\w*|coeliac|celiaquia|"
    r"lymphoma|linfoma|melanoma|carcinoma|sarcoma|myeloma|mieloma|glioma|metasta\w*|"
    r"crohn\w*|colitis|arthritis|artritis|dementia|demencia|alzheimer\w*|parkinson\w*|"
    r"multiple sclerosis|esclerosis|fibromyalgia|fibromialgia|lupus|covid\w*|"
    r"eating disorder|anorexi\w*|bulimi\w*|ocd|ptsd|tept|insomni\w*|sleep apnea|apnea del sueno|"
    r"addict\w*|adiccion\w*|adict[oa]|alcoholi\w*|rehab|rehabilitacion|sobriety|sobriedad|overdose|"
    r"suicid\w*|self[- ]harm|autolesi\w*|pregnan\w*|embarazad[oa]|embarazo|miscarriage|aborto|"
    r"infertil\w*|ivf|fecundacion in vitro|herpes|"
    r"disabilit\w*|disabled|discapacidad|discapacitad[oa]|wheelchair|silla de ruedas|"
    r"blind|ciego|ciega|deaf|sordo|sorda|"
    # treatment and care
    r"medicat\w*|medicament\w*|medicacion|prescri\w*|receta medica|pills?|pastillas?|"
    r"tablets? (?:of|de)|dosis|dosage|insulin\w*|insulina|metformin\w*|antidepress\w*|antidepresiv\w*|"
    r"sertralin\w*|fluoxetin\w*|prozac|zoloft|lexapro|xanax|valium|diazepam|lorazepam|"
    r"adderall|ritalin|methylphenidate|metilfenidato|methotrexate|metotrexato|statins?|estatinas?|"
    r"levothyrox\w*|eutirox|antibiotic\w*|antibiotico\w*|inhaler|inhalador|ventolin|"
    r"ibuprofen\w*|paracetamol|opioid\w*|opiaceo\w*|morphine|morfina|"
    r"therapy|terapia|psychiatric|psiquiatric[oa]|"
    r"(?:sees|seeing|visits|goes to) (?:a |an |his |her |their )?(?:psychologist|psychiatrist|therapist|"
    r"counsel+or|oncologist|cardiologist|neurologist|rheumatologist|endocrinologist)|"
    r"(?:va|acude|fue) (?:al|a la|a su) (?:psicolog[oa]|psiquiatra|terapeuta|oncolog[oa]|cardiolog[oa]|"
    r"neurolog[oa]|reumatolog[oa]|endocrino)|"
    r"treated for|under treatment|en tratamiento (?:por|de|contra)|(?:se )?esta tratando (?:de |un |una )|"
    r"surgery|cirugia|operad[oa] de|transplant\w*|trasplante|hospitali[sz]\w*|"
    r"dialysis|dialisis|physiotherapy|fisioterapia|"
    # a device a body depends on, when the person has one (not when they build them)
    r"(?:has|had|have|wears?|wearing|uses?|using|got|gets|needs?|relies on|lleva|llevaba|tiene|usa|"
    r"necesita|pusieron|implantaron|puesto)\b(?:\s+\S+){0,3}?\s+(?:pacemaker|marcapasos|defibrillator|"
    r"desfibrilador|hearing aids?|audifonos?|insulin pump|bomba de insulina|prosthe\w*|protesis|stent|"
    r"cpap|colostom\w*|glucose monitor)|"
    r"blood (?:type|group|test)|grupo sanguineo|analisis de sangre"
    r")\b"
    r"|\b\d+(?:[.,]\d+)?\s?(?:mg|mcg)\b"
)


def is_health(folded: str) -> bool:
    return bool(_HEALTH.search(folded))
